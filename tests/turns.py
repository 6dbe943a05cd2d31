"""Runnable documentation in turn: each notebook, document or docstring module that trains, generates or exports
runs on one backend per `make test`, the sorted names dealt round the three backends.

Every one of them runs in every `make test` (each on the backend whose turn it is), and every backend runs a
third of them; the behaviour they show is tested on every backend by the suite's own tests. Running them all on
all three put the suite past CI's time. `KT_DOCS_EVERY_BACKEND=1` runs every one on the backend under test
(`KT_NOTEBOOKS_EVERY_BACKEND=1`, its older name, still does).
"""

import os

import keras
import pytest

BACKENDS = ("tensorflow", "jax", "torch")
_EVERY_BACKEND = ("KT_DOCS_EVERY_BACKEND", "KT_NOTEBOOKS_EVERY_BACKEND")


def dealt(names, backends=None):
    """{name: the backend it runs on}: `names` sorted and dealt round the backends; `backends` (name -> the
    backends it may run on) narrows a name to those it claims."""
    turns = {}
    for index, name in enumerate(sorted(names)):
        allowed = [b for b in BACKENDS if b in (backends or {}).get(name, BACKENDS)] or list(BACKENDS)
        turns[name] = allowed[index % len(allowed)]
    return turns


def skip_unless_its_turn(name, turns, what):
    """Skip the running test unless `name` runs on the backend under test (or KT_DOCS_EVERY_BACKEND=1)."""
    if any(os.environ.get(variable) == "1" for variable in _EVERY_BACKEND):
        return
    if turns[name] != keras.config.backend():
        pytest.skip(f"{what} {name}: run under {turns[name]} in make test (one backend each, in turn: tests/turns.py)")
