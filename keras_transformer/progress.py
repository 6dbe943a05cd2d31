"""What a long export says while it runs: one line per phase, and a Keras progress bar over the layers where a phase
goes layer by layer (a graph built by the ONNX kernels), or over the tensors where it writes them one at a time (the
Hugging Face and GGUF files).

`export(..., verbose="auto")` shows them for a model of `AUTO_PARAMETERS` or more (an export of seconds or more);
`verbose=True` always, `False` never.
"""

import time

import keras

AUTO_PARAMETERS = 100_000_000


def resolve(verbose, task):
    """`verbose` ("auto", True or False) for `task` -> bool."""
    if verbose == "auto":
        return task.count_params() >= AUTO_PARAMETERS
    if verbose not in (True, False):
        raise ValueError(f"`verbose` must be 'auto', True or False. Received: verbose={verbose!r}")
    return bool(verbose)


class Phase:
    """`with Phase("decode graph", verbose, layers=L) as phase:` ... `phase.step()` after each layer: prints the phase's
    name, a progress bar over its L layers (none when L is 0; `unit` names what it counts), and the seconds it took."""

    def __init__(self, name, verbose, layers=0, unit="layer"):
        self.name, self.verbose, self.layers, self.count, self.unit = name, verbose, layers, 0, unit
        self.bar = None

    def __enter__(self):
        self.start = time.perf_counter()
        if self.verbose:
            print(f"{self.name} ...", flush=True)
            if self.layers:
                self.bar = keras.utils.Progbar(self.layers, unit_name=self.unit)
        return self

    def step(self):
        self.count += 1
        if self.bar is not None:
            self.bar.update(min(self.count, self.layers))

    def __exit__(self, kind, *exc_info):
        if self.verbose and kind is None:
            print(f"{self.name}: done in {time.perf_counter() - self.start:.1f} s", flush=True)


QUIET = Phase("", False)  # a phase that says nothing (what a graph builder gets when no one listens)

__all__ = ["AUTO_PARAMETERS", "QUIET", "Phase", "resolve"]
