"""Models shared by the generation tests (built once: building and compiling dominate their time)."""

import pytest

from tests.samplers.helpers import tiny_gpt


@pytest.fixture(scope="package")
def gpt():
    """A tiny random GPT with a vocabulary of 8: small enough for exhaustive beam checks."""
    return tiny_gpt(vocabulary_size=8, max_sequence_length=64)
