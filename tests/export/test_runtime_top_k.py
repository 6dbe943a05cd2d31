"""The bundle runner's `_top_k` (beam search's candidates) against a plain stable sort: the k largest
of each row, best first, ties in index order, as `keras.ops.top_k`."""

import numpy as np
import pytest

from tests.export.helpers import runtime_module

NEG = -1e9  # the runner's score of a beam that is not alive


def reference_top_k(values, k):
    index = np.argsort(-values, axis=-1, kind="stable")[:, :k]  # stable: equal values keep index order
    return np.take_along_axis(values, index, axis=-1), index


def rows_of(kind, rng, rows, width):
    values = rng.standard_normal((rows, width)).astype(np.float32)
    if kind == "ties":  # few distinct values: many ties at the k-th largest
        values = np.round(values * 2) / 2
    elif kind == "one_live_beam":  # beam search's first step: only the first quarter is alive
        values[:, width // 4 :] += NEG
    elif kind == "sorted":  # the largest values in one chunk, at the end
        values = np.sort(values, axis=-1)
    elif kind == "minus_inf":
        values[:, ::3] = -np.inf
    return values


@pytest.mark.parametrize("kind", ["random", "ties", "one_live_beam", "sorted", "minus_inf"])
@pytest.mark.parametrize("rows, width, k", [(8, 32000, 8), (3, 4 * 8000, 12), (2, 50021, 8), (4, 100, 8), (2, 7, 7)])
def test_top_k_is_a_stable_sort(kind, rows, width, k):
    values = rows_of(kind, np.random.default_rng(width + k), rows, width)
    top, index = runtime_module()._top_k(values, k)
    expected_top, expected_index = reference_top_k(values, k)
    np.testing.assert_array_equal(index, expected_index)
    np.testing.assert_array_equal(top, expected_top)
