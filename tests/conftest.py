"""Shared pytest setup: backend banner, numpy conversion, seeds.

The backend comes from KERAS_BACKEND (tensorflow, jax or torch); every test runs on all three,
nothing here skips a backend.
"""

import gc
import os
import random
import tempfile

# JAX: one persistent compilation cache for the suite's workers and the child processes they start. Many
# tests build models of the same config, whose programs differ only in their weights (arguments): a program
# compiled once is read back by every later test (tests/models/test_lora.py: 17% less CPU time, cold cache).
# Keyed by the program and the JAX version, so a stale entry is never used. TensorFlow's XLA cache
# (--tf_xla_persistent_cache_directory) saved nothing measurable: not set.
# No size limit (-1, JAX's default): with one, every write globs and stats the whole cache under a file lock
# (jax/_src/lru_cache.py), quadratic in the entries; CI's JAX run took 3031 s with a 1 GiB limit.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(tempfile.gettempdir(), "keras_transformer_jax_cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", "-1")

if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs two workers on a 2-core machine: one compute thread each, or the backends'
    # thread pools (torch's OpenMP above all) spin against each other. Set before Keras imports them.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false").strip()

import keras
import numpy as np
import pytest

if keras.config.backend() == "torch":
    import torch

    # One intra-op thread for the whole suite: the test models are tiny, and on a 2-core machine
    # torch's default two threads wait on each other at every op (eager steps measured up to 10x
    # slower in CPU time than with one). Results do not depend on it.
    torch.set_num_threads(1)

# The backends' modules, imported above, hold millions of objects that live as long as the process: moved out of
# the collector's reach, so that its full collections walk only what the tests create (PyTorch, tests/models/t5 and
# test_quantize: 15% less CPU time; JAX's test_quantize 13%).
gc.freeze()


def pytest_report_header(config):
    return f"keras {keras.__version__}, KERAS_BACKEND={keras.config.backend()}"


def pytest_sessionstart(session):
    print(f"\n[keras_transformer tests] backend: {keras.config.backend()}")


# The test files that share an expensive session-scoped fixture (tests/export/conftest.py's `exported`: each
# family exported once) run in one pytest-xdist worker; every other test file, the export tests that build their
# own models included, is a unit of its own, so the other worker takes them (a new file that asks for `exported`
# and is not listed here still passes: its worker exports the families again).
SHARED_FIXTURE_FILES = tuple(
    f"tests/export/{name}.py"
    for name in (
        "test_decode_kernels",
        "test_decoder_export",
        "test_encoder_export",
        "test_runtime_parity",
        "test_saved_model",
        "test_seq2seq_export",
        "test_serve",
    )
)


def pytest_xdist_make_scheduler(config, log):
    """`make test` runs `pytest -n 2 --dist loadfile`: whole files go to a worker, so module-scoped
    fixtures are built once; here the files sharing tests/export's session fixture also stay together."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class FileScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            path = nodeid.split("::", 1)[0]
            return "tests/export (shared exports)" if path in SHARED_FIXTURE_FILES else path

    return FileScheduling(config, log)


def to_numpy(x):
    """Backend tensor (or nested tuple/list of them) -> numpy."""
    if isinstance(x, (tuple, list)):
        return type(x)(to_numpy(t) for t in x)
    return keras.ops.convert_to_numpy(x)


@pytest.fixture(name="to_numpy")
def to_numpy_fixture():
    return to_numpy


SEED = 1234


@pytest.fixture(autouse=True)
def seed():
    """Seeds Python, numpy and the backend's own generator before every test.

    The layer tests draw inputs and weights from numpy (`rng`), so their expected values never
    depend on a backend's random stream. Not keras.utils.set_random_seed: it imports TensorFlow
    even under JAX and PyTorch, seconds per session for nothing these tests need.
    """
    random.seed(SEED)
    np.random.seed(SEED)
    if keras.config.backend() == "torch":
        import torch

        torch.manual_seed(SEED)
    elif keras.config.backend() == "tensorflow":
        import tensorflow as tf

        tf.random.set_seed(SEED)
    return SEED


@pytest.fixture
def rng(seed):
    """A fresh numpy Generator per test, for inputs and weights."""
    return np.random.default_rng(seed)


@pytest.fixture(autouse=True)
def float32_policy():
    """Each test starts and ends under the float32 policy, even if it changed the global one."""
    keras.config.set_dtype_policy("float32")
    yield
    keras.config.set_dtype_policy("float32")
