"""`generate`'s inputs read and checked on the host: prompts or sources in every form a user passes, and
the stop tokens.

Axes: B inputs, S_enc encoder length.
"""

import numbers

import keras
import numpy as np

# Buffer and prefill lengths are rounded up to these multiples, so one compiled loop serves
# every call whose prompts and max_new_tokens fall in the same bucket.
LENGTH_BUCKET = 64
PREFILL_BUCKET = 32


def round_up(value, multiple):
    return -(-value // multiple) * multiple


def read_inputs(task, inputs, vocabulary_size):
    """-> (form, rows): how the results must look, and the id lists (prompts), or the texts (sources)."""
    if isinstance(inputs, (str, bytes)) or (
        isinstance(inputs, (list, tuple, np.ndarray)) and len(inputs) and _is_text(_first(inputs))
    ):
        if task.preprocessor is None:
            raise ValueError("String inputs need a task with a preprocessor; pass token ids instead.")
        form = "string" if isinstance(inputs, (str, bytes)) else "strings"
        texts = [inputs] if form == "string" else list(np.asarray(inputs, dtype=object).reshape(-1))
        if hasattr(task, "compute_cross_cache"):
            return form, texts  # sources: the preprocessor tokenizes and packs them
        return form, _check_rows(task.preprocessor.generate_preprocess(texts), vocabulary_size)

    if not isinstance(inputs, (np.ndarray, list, tuple)):
        try:
            inputs = keras.ops.convert_to_numpy(inputs)  # a backend tensor
        except Exception:
            raise ValueError(
                "`inputs` must be a string, a list of strings, or token ids (an int array or a list of id "
                f"lists). Received: {type(inputs).__name__}"
            ) from None
    if isinstance(inputs, np.ndarray):
        if inputs.ndim not in (1, 2):
            raise ValueError(f"`inputs` must be a 1-D or 2-D array of token ids. Received: shape={inputs.shape}")
        form = "array1d" if inputs.ndim == 1 else "array2d"
        rows = [inputs] if inputs.ndim == 1 else list(inputs)
    elif len(inputs) and all(np.ndim(x) == 0 for x in inputs):
        form, rows = "list1d", [inputs]
    else:
        form, rows = "list2d", list(inputs)
    return form, _check_rows(rows, vocabulary_size)


def _check_rows(rows, vocabulary_size):
    """Id rows -> lists of ints; empty batches or prompts, non-integer or out-of-vocabulary ids are errors.

    Ids are never clamped: a gather on JAX would silently clamp them to the vocabulary.
    """
    if not len(rows):
        raise ValueError("`inputs` is an empty batch: pass at least one prompt.")
    checked = []
    for row in rows:
        row = np.asarray(row)
        if row.ndim != 1:
            raise ValueError(f"Each prompt must be a 1-D sequence of token ids. Received: shape={row.shape}")
        if row.size == 0:
            raise ValueError("An empty prompt: `inputs` must hold at least one token per row.")
        if row.dtype.kind not in "iu":
            raise ValueError(f"`inputs` must hold integer token ids. Received: dtype={row.dtype}")
        bad = row[(row < 0) | (row >= vocabulary_size)]
        if bad.size:
            raise ValueError(
                f"`inputs` holds token id {int(bad[0])}, outside [0, vocabulary_size={vocabulary_size}). "
                f"Received: inputs with ids in [{int(row.min())}, {int(row.max())}]"
            )
        checked.append(row.astype("int32").tolist())
    return checked


def _first(x):
    while isinstance(x, (list, tuple, np.ndarray)) and len(x):
        x = x[0]
    return x


def _is_text(x):
    return isinstance(x, (str, bytes, np.str_, np.bytes_))


def encoder_inputs(task, form, inputs, rows, pad_id):
    """Sources -> (encoder ids (B, S_enc) int32, mask (B, S_enc) bool)."""
    if form in ("string", "strings"):
        ids, mask = task.preprocessor.generate_preprocess(rows)
        return np.asarray(ids, "int32"), np.asarray(mask, bool)
    longest = max(len(r) for r in rows)
    width = round_up(longest, PREFILL_BUCKET)
    if task.backbone.max_sequence_length >= longest:
        width = min(width, task.backbone.max_sequence_length)
    ids = np.full((len(rows), width), pad_id, "int32")
    mask = np.zeros((len(rows), width), bool)
    for row, source in enumerate(rows):
        ids[row, : len(source)] = source
        mask[row, : len(source)] = True
    return ids, mask


def decoder_start_token_id(task):
    start = getattr(task.preprocessor, "decoder_start_token_id", None) if task.preprocessor is not None else None
    if start is None:
        start = getattr(task, "decoder_start_token_id", None)
    if start is None:
        start = 0  # T5's convention: the decoder starts from the padding id 0
    return int(start)


def stop_token_ids(stop_token_ids, tokenizer, vocabulary_size):
    """`generate`'s stop_token_ids ("auto", None, an id or ids) -> a tuple of ids, checked against the vocabulary."""
    if stop_token_ids is None:
        return ()
    if isinstance(stop_token_ids, str):
        if stop_token_ids != "auto":
            raise ValueError(
                "`stop_token_ids` must be 'auto', None or a list of token ids. "
                f"Received: stop_token_ids={stop_token_ids!r}"
            )
        eos = tokenizer.eos_token_id if tokenizer is not None else None
        return () if eos is None else (int(eos),)
    if isinstance(stop_token_ids, numbers.Integral) and not isinstance(stop_token_ids, bool):
        stop_token_ids = [stop_token_ids]
    ids = (
        list(np.asarray(stop_token_ids).reshape(-1).tolist())
        if not isinstance(stop_token_ids, (list, tuple))
        else list(stop_token_ids)
    )
    for token_id in ids:
        if (
            isinstance(token_id, bool)
            or not isinstance(token_id, numbers.Integral)
            or not 0 <= token_id < vocabulary_size
        ):
            raise ValueError(
                f"`stop_token_ids` must hold token ids in [0, vocabulary_size={vocabulary_size}). "
                f"Received: stop_token_ids={stop_token_ids!r}"
            )
    return tuple(int(t) for t in ids)
