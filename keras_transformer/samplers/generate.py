"""`generate` for causal and encoder-decoder LMs: read and check the inputs, run the loop, shape the outputs.

Axes: B inputs, K beams, R = B * K rows, L token buffer length (a bucket), P prefill length.
Everything here is host-side numpy; the compiled loop lives in `decode_loop.py`, run by `decode.py`.
"""

import numbers

import keras
import numpy as np

from keras_transformer.samplers.decode import decode
from keras_transformer.samplers.decode_options import DecodeOptions
from keras_transformer.samplers.registry import get

# Buffer and prefill lengths are rounded up to these multiples, so one compiled loop serves
# every call whose prompts and max_new_tokens fall in the same bucket.
LENGTH_BUCKET = 64
PREFILL_BUCKET = 32


def generate(
    task,
    inputs,
    max_new_tokens=32,
    sampler=None,
    stop_token_ids="auto",
    min_new_tokens=0,
    repetition_penalty=1.0,
    no_repeat_ngram_size=0,
    streamer=None,
    return_dict=False,
    output_logits=False,
):
    """Generate from a causal LM (continue prompts) or a seq2seq LM (transduce sources).

    See `LanguageModel.generate` (models/language_model.py) for the arguments and return values.
    """
    sampler = get(sampler if sampler is not None else getattr(task, "sampler", None) or "greedy")
    _check_int("max_new_tokens", max_new_tokens, 1)
    _check_int("min_new_tokens", min_new_tokens, 0)
    _check_int("no_repeat_ngram_size", no_repeat_ngram_size, 0)
    if isinstance(repetition_penalty, bool) or not isinstance(repetition_penalty, numbers.Real) or not (
        repetition_penalty > 0
    ):
        raise ValueError(f"`repetition_penalty` must be a number > 0. Received: repetition_penalty={repetition_penalty!r}")
    if streamer is not None and not callable(streamer):
        raise ValueError(f"`streamer` must be a callable or None. Received: streamer={streamer!r}")
    if streamer is not None and sampler.reorders_rows:
        raise ValueError("`streamer` is not supported with beam search: the best beam is known only at the end.")
    if output_logits and (not return_dict or sampler.reorders_rows):
        raise ValueError(
            "`output_logits=True` needs `return_dict=True` and a sampler other than beam search. "
            f"Received: return_dict={return_dict}, sampler={sampler!r}"
        )

    seq2seq = hasattr(task, "compute_cross_cache")
    backbone = task.backbone
    vocabulary_size = backbone.vocabulary_size
    max_length = backbone.max_sequence_length
    tokenizer = getattr(task.preprocessor, "tokenizer", None) if task.preprocessor is not None else None
    pad_id = tokenizer.pad_token_id if tokenizer is not None and tokenizer.pad_token_id is not None else 0
    stop_ids = _stop_token_ids(stop_token_ids, tokenizer, vocabulary_size)

    form, rows = _read_inputs(task, inputs, vocabulary_size)
    batch_size = len(rows)
    if seq2seq:
        encoder_ids, encoder_mask = _encoder_inputs(task, form, inputs, rows, pad_id)
        if encoder_ids.shape[1] > max_length:
            raise ValueError(
                f"A source of {encoder_ids.shape[1]} tokens is longer than the model's "
                f"max_sequence_length={max_length}."
            )
        start_id = _decoder_start_token_id(task)
        prompts = [[start_id]] * batch_size
    else:
        prompts = rows
    longest = max(len(p) for p in prompts)
    if longest + max_new_tokens > max_length:
        raise ValueError(
            f"The longest prompt ({longest} tokens) plus `max_new_tokens`={max_new_tokens} is longer than "
            f"the model's max_sequence_length={max_length}. Received: max_new_tokens={max_new_tokens}"
        )

    arrays = _loop_inputs(prompts, max_new_tokens, max_length, pad_id, sampler)
    arrays["min_new_tokens"] = np.array(min_new_tokens, "int32")
    arrays["repetition_penalty"] = np.array(repetition_penalty, "float32")
    if repetition_penalty != 1.0:  # the tokens before the first step, per row
        arrays["seen"] = np.zeros((len(arrays["token_ids"]), vocabulary_size), bool)
        for row, ids in enumerate(arrays["token_ids"]):
            arrays["seen"][row, ids[: arrays["start"]]] = True
    if seq2seq:
        arrays["encoder_token_ids"] = encoder_ids
        arrays["encoder_padding_mask"] = encoder_mask
    options = DecodeOptions(
        stop_token_ids=stop_ids, pad_id=pad_id, repetition=repetition_penalty != 1.0,
        no_repeat_ngram_size=no_repeat_ngram_size, return_logits=output_logits,
        streaming=streamer is not None,
    )
    outputs = decode(task, sampler, options, arrays, streamer=streamer)

    # Cut every result: prompt + generated tokens, up to and including the first stop token.
    results, scores, logits = [], None, None
    if not sampler.reorders_rows:
        for row, prompt in enumerate(prompts):
            generated = outputs["token_ids"][row, len(prompt) : len(prompt) + max_new_tokens]
            results.append(outputs["token_ids"][row, : len(prompt) + _stop_length(generated, stop_ids)])
        if "logits" in outputs:
            logits = [outputs["logits"][row, len(p) : len(r)] for row, (p, r) in enumerate(zip(prompts, results))]
    else:
        scores = outputs["scores"]  # (B, n)
        for row in range(batch_size):
            hypotheses = [outputs["token_ids"][row, n, : outputs["ends"][row, n]] for n in range(sampler.num_return_sequences)]
            results.append(hypotheses if sampler.num_return_sequences > 1 else hypotheses[0])
    results = _format(task, form, results, sampler.num_return_sequences, pad_id)
    if not return_dict:
        return results
    return {"outputs": results, "scores": scores, "logits": logits}


def _loop_inputs(prompts, max_new_tokens, max_length, pad_id, sampler):
    """The loop's numpy inputs: right-padded token buffers (per input and per beam row), lengths, the noise seed."""
    num_beams = sampler.num_beams
    batch_size = len(prompts)
    prompt_lengths = np.array([len(p) for p in prompts], "int32")
    longest, start = int(prompt_lengths.max()), int(prompt_lengths.min())
    length = min(_round_up(longest + max_new_tokens, LENGTH_BUCKET), max_length)
    # The prefill covers every prompt but the last token of the longest (bucketed): positions past a
    # shorter prompt hold pad keys, which the steps overwrite before any query reads them.
    prefill = 0 if longest == 1 else min(_round_up(longest - 1, PREFILL_BUCKET), length)
    tokens = np.full((batch_size, length), pad_id, "int32")
    for row, prompt in enumerate(prompts):
        tokens[row, : len(prompt)] = prompt
    rows = np.repeat(tokens, num_beams, axis=0)  # (B, L) -> (R, L)
    arrays = {
        "prompt_token_ids": tokens,  # (B, L)
        "prefill_token_ids": tokens[:, :prefill],  # (B, P)
        "token_ids": rows,  # (R, L)
        "prompt_lengths": np.repeat(prompt_lengths, num_beams),  # (R,)
        "start": np.array(start, "int32"),
        "max_new_tokens": np.array(max_new_tokens, "int32"),
    }
    seed = sampler.draw_seed()  # the loop hashes (seed, step, row) into its noise (see `noise.py`)
    if seed is not None:
        arrays["seed"] = np.array(seed, "int32")
    return arrays


def _check_int(name, value, minimum):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"`{name}` must be an int >= {minimum}. Received: {name}={value!r}")


def _round_up(value, multiple):
    return -(-value // multiple) * multiple


def _stop_length(generated, stop_ids):
    """Number of generated tokens kept: up to and including the first stop token."""
    if stop_ids:
        hits = np.flatnonzero(np.isin(generated, stop_ids))
        if hits.size:
            return int(hits[0]) + 1
    return len(generated)


def _stop_token_ids(stop_token_ids, tokenizer, vocabulary_size):
    if stop_token_ids is None:
        return ()
    if isinstance(stop_token_ids, str):
        if stop_token_ids != "auto":
            raise ValueError(
                f"`stop_token_ids` must be 'auto', None or a list of token ids. Received: stop_token_ids={stop_token_ids!r}"
            )
        eos = tokenizer.eos_token_id if tokenizer is not None else None
        return () if eos is None else (int(eos),)
    if isinstance(stop_token_ids, numbers.Integral) and not isinstance(stop_token_ids, bool):
        stop_token_ids = [stop_token_ids]
    ids = list(np.asarray(stop_token_ids).reshape(-1).tolist()) if not isinstance(stop_token_ids, (list, tuple)) else list(stop_token_ids)
    for token_id in ids:
        if isinstance(token_id, bool) or not isinstance(token_id, numbers.Integral) or not 0 <= token_id < vocabulary_size:
            raise ValueError(
                f"`stop_token_ids` must hold token ids in [0, vocabulary_size={vocabulary_size}). "
                f"Received: stop_token_ids={stop_token_ids!r}"
            )
    return tuple(int(t) for t in ids)


# --- inputs -------------------------------------------------------------------


def _read_inputs(task, inputs, vocabulary_size):
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


def _encoder_inputs(task, form, inputs, rows, pad_id):
    """Sources -> (encoder ids (B, S_enc) int32, mask (B, S_enc) bool)."""
    if form in ("string", "strings"):
        ids, mask = task.preprocessor.generate_preprocess(rows)
        return np.asarray(ids, "int32"), np.asarray(mask, bool)
    longest = max(len(r) for r in rows)
    width = _round_up(longest, PREFILL_BUCKET)
    if task.backbone.max_sequence_length >= longest:
        width = min(width, task.backbone.max_sequence_length)
    ids = np.full((len(rows), width), pad_id, "int32")
    mask = np.zeros((len(rows), width), bool)
    for row, source in enumerate(rows):
        ids[row, : len(source)] = source
        mask[row, : len(source)] = True
    return ids, mask


def _decoder_start_token_id(task):
    start = getattr(task.preprocessor, "decoder_start_token_id", None) if task.preprocessor is not None else None
    if start is None:
        start = getattr(task, "decoder_start_token_id", None)
    if start is None:
        start = 0  # T5's convention: the decoder starts from the padding id 0
    return int(start)


# --- outputs ------------------------------------------------------------------


def _format(task, form, results, num_return_sequences, pad_id):
    """Id rows -> the caller's form: strings for strings, arrays for arrays, lists for lists."""
    nested = num_return_sequences > 1
    flat = [r for group in results for r in group] if nested else results
    if form in ("string", "strings"):
        out = task.preprocessor.generate_postprocess([np.asarray(r) for r in flat])
    elif form in ("list1d", "list2d"):
        out = [np.asarray(r).astype(int).tolist() for r in flat]
    else:
        width = max(len(r) for r in flat)
        out = np.full((len(flat), width), pad_id, "int32")
        for i, r in enumerate(flat):
            out[i, : len(r)] = r
    if nested:
        n = num_return_sequences
        out = out.reshape(len(results), n, -1) if isinstance(out, np.ndarray) else [out[i : i + n] for i in range(0, len(out), n)]
    if form in ("string", "list1d", "array1d"):
        return out[0]
    return out
