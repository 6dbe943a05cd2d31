"""Counter-based noise for random sampling: one uniform number per (seed, step, row), computed in the graph.

The number a row draws at a step is a pure function of the call's seed, the step (the
position being chosen) and the row, so it needs no state, no host-side array and no
backend random generator: the compiled loops (JAX, TensorFlow, PyTorch), the SavedModel's
`generate` signature and the Keras-free bundle runner (`export/runtime/sampling.py`, which
carries a numpy copy of these few lines) draw the same numbers, and a row's noise does not
depend on the batch it shares or on the buffer length.

The hash is Chris Wellons' `lowbias32` integer mixer applied three times, to the seed, then
to the result xor the step, then to that xor the row: a bijection of 32-bit integers at
each stage, written in int32 arithmetic (multiplications wrap modulo 2**32, right shifts are
made logical with a mask), which every backend and numpy's uint32 compute bit for bit alike.
The top 24 bits give a float32 in (0, 1], exactly: (h >> 8) + 1 is at most 2**24.
"""

from keras import ops

# The constants as int32 (two's complement of the uint32 values in the comments).
_SEED_KEY = -1640531527  # 0x9E3779B9
_MULTIPLIER_1 = 0x7FEB352D
_MULTIPLIER_2 = -2073254261  # 0x846CA68B


def _shift_right(x, bits):
    """Logical right shift of int32 x (ops.right_shift is arithmetic on signed integers)."""
    return ops.bitwise_and(ops.right_shift(x, bits), (1 << (32 - bits)) - 1)


def _mix(x):
    """lowbias32: a bijective avalanche hash of 32-bit integers (int32 in, int32 out)."""
    x = ops.bitwise_xor(x, _shift_right(x, 16))
    x = ops.multiply(x, _MULTIPLIER_1)
    x = ops.bitwise_xor(x, _shift_right(x, 15))
    x = ops.multiply(x, _MULTIPLIER_2)
    return ops.bitwise_xor(x, _shift_right(x, 16))


def uniform_noise(seed, step, num_rows):
    """The noise of one step: (R,) float32 in (0, 1], entry r a function of (seed, step, r) only.

    Args:
        seed: int32 scalar (a tensor inside the loop; see `Sampler.draw_seed`).
        step: int32 scalar, the position being chosen.
        num_rows: R, an int or a scalar tensor.
    """
    return _uniform(seed, step, ops.arange(num_rows, dtype="int32"))


def noise_grid(seed, shape):
    """The noise of steps [0, L) and rows [0, R) at once: (L, R) float32, row i = `uniform_noise(seed, i, R)`."""
    steps, rows = shape
    return _uniform(seed, ops.arange(steps, dtype="int32")[:, None], ops.arange(rows, dtype="int32")[None, :])


def _uniform(seed, step, row):
    """seed (), step and row int32, broadcast together -> float32 in (0, 1] of their shape."""
    h = _mix(ops.bitwise_xor(ops.cast(seed, "int32"), _SEED_KEY))
    h = _mix(ops.bitwise_xor(h, ops.cast(step, "int32")))
    h = _mix(ops.bitwise_xor(h, row))
    return ops.cast(_shift_right(h, 8) + 1, "float32") * (2.0**-24)


def seed_to_int32(seed):
    """Any Python int -> the int32 the hash reads (its value modulo 2**32, as two's complement)."""
    seed = int(seed) % 2**32
    return seed - 2**32 if seed >= 2**31 else seed
