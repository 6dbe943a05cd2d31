"""Timing shared by the benchmarks: alternating rounds, best times, median ratios."""

import time


def seconds(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def paired(fns, repeats):
    """Time the functions in turn, `repeats` rounds after two untimed calls of each: the first compiles,
    the second compiles what a first call runs eagerly (PyTorch's compiled prefill).

    Returns (first-call seconds, best seconds, per-round seconds) per function. This machine's
    speed drifts by tens of percent within seconds; alternating the calls lets the drift hit all
    of them alike, and ratios are taken round by round (their median is reported).
    """
    firsts = [seconds(fn) for fn in fns]
    for fn in fns:
        fn()
    rounds = [[seconds(fn) for fn in fns] for _ in range(repeats)]
    per_fn = list(zip(*rounds))
    return firsts, [min(times) for times in per_fn], per_fn
