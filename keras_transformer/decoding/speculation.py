"""Speculation: the static settings of a speculative decoding loop, frozen and complete when built.

Speculative decoding (Leviathan et al. 2023, Chen et al. 2023): a cheap proposer guesses K tokens, and the
model checks all K + 1 positions in one cached step (the verify pass, `speculative_loop.py`). transformers
calls the proposers `prompt_lookup_num_tokens` (prompt lookup) and `assistant_model` (a draft model).
"""

import dataclasses


@dataclasses.dataclass(frozen=True)
class Speculation:
    """Static settings of one speculative loop; the object itself is part of its compile key.

    Args:
        num_draft_tokens: K >= 1, the tokens proposed (and checked) per step.
        max_matching_ngram_size: N >= 1, prompt lookup's longest n-gram matched against the history.
    """

    num_draft_tokens: int
    max_matching_ngram_size: int = 2

    def __post_init__(self):
        for name in ("num_draft_tokens", "max_matching_ngram_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"`{name}` must be an int >= 1. Received: {name}={value!r}")

    def replace(self, **changes):
        """A copy with `changes` (the settings stay frozen)."""
        return dataclasses.replace(self, **changes)
