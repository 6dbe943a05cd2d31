"""`decode`: run the compiled prefill and decoding loop on numpy inputs (see `decode_loop.py`).

Axes: B inputs, K beams, R = B * K decoded rows, L token buffer length, P prefill length.
"""

import numpy as np
from keras import ops

from keras_transformer.samplers import compile as compile_lib
from keras_transformer.samplers.cache_schedule import cache_width, cache_widths, widen
from keras_transformer.samplers.decode_loop import body, cache_dtype, is_seq2seq, one_step, prepare, run, start

_PREPARE_INPUTS = ("prompt_token_ids", "prefill_token_ids", "encoder_token_ids", "encoder_padding_mask")


def decode(task, sampler, options, inputs, streamer=None):
    """Run the compiled prefill and loop on numpy `inputs`; returns the sampler's outputs as numpy.

    Args:
        task: a `CausalLM` or `Seq2SeqLM`.
        sampler: a `Sampler`.
        options: `DecodeOptions` with what the caller asks for; `compile.plan` completes how it runs.
        inputs: dict of numpy arrays. Per input: prompt_token_ids (B, L), prefill_token_ids
            (B, P), and encoder_token_ids / encoder_padding_mask (B, S_enc) for seq2seq. Per row
            (R = B * num_beams): token_ids (R, L), prompt_lengths (R,), seen (R, V) with a
            repetition penalty. Scalars: start, max_new_tokens, min_new_tokens, seed (samplers with noise),
            repetition_penalty.
        streamer: None, or a callable receiving after every step the (R,) numpy array of
            the token each row produced (-1 where a row produced none).
    """
    rows, length = inputs["token_ids"].shape
    bits = int("".join(c for c in cache_dtype(task) if c.isdigit()))  # float32 -> 32, bfloat16 -> 16
    cache_bytes = int(np.prod(task.backbone.cache_shape(rows, length))) * bits // 8
    plan = compile_lib.plan(task, sampler, options, inputs, cache_bytes)
    options, kernels = plan.options, plan.kernels
    inputs = {k: ops.convert_to_tensor(v) for k, v in inputs.items()}
    prepare_inputs = {k: v for k, v in inputs.items() if k in _PREPARE_INPUTS}
    loop_inputs = {k: v for k, v in inputs.items() if k not in _PREPARE_INPUTS}
    # The kernels are an argument (PyTorch only). A compiled PyTorch prefill is one graph per input shape
    # (prompt and prefill buckets, batch), as a step is one per (batch, cache width). A seq2seq encoder
    # runs through Keras's layers, which do not compile as one graph (Keras's attention asks a pybind
    # object whether flash attention applies): it stays eager, one pass per call.
    compiled_prefill = plan.stepwise and not is_seq2seq(task)
    shapes = tuple((k, tuple(v.shape)) for k, v in sorted(prepare_inputs.items())) if compiled_prefill else ()
    prepared = compile_lib.compiled(task, ("prepare",) + shapes, lambda: lambda x, k: prepare(task, x, k),
                                    step=compiled_prefill)(prepare_inputs, kernels)
    key = (sampler._trace_key(), options)
    if streamer is None and not plan.stepwise:
        loop = compile_lib.compiled(task, ("run",) + key, lambda: lambda x, p, k: run(task, sampler, options, x, p, k))
        return compile_lib.to_numpy(loop(loop_inputs, prepared, kernels))
    begin = compile_lib.compiled(task, ("start",) + key, lambda: lambda x, p: start(task, sampler, options, x, p))
    if plan.stepwise:  # each step one compiled graph (PyTorch)
        step = compile_lib.compiled(
            task, ("step", length) + key, lambda: lambda x, i, s, k: body(task, sampler, options, x, i, s, None, k),
            step=True)
    else:  # the loop's step as a one-iteration loop (XLA), so that the streamer sees every token
        step = compile_lib.compiled(
            task, ("step",) + key, lambda: lambda x, i, s, k: one_step(task, sampler, options, x, i, s, k))
    i, state = begin(loop_inputs, prepared)
    widths = cache_widths(length, cache_width(state), options.chunked_cache)
    position = int(ops.convert_to_numpy(i))
    while position < length and bool(ops.convert_to_numpy(sampler._is_running(state))):
        state = widen(state, next(w for w in widths if w >= position))  # step i writes at i - 1
        i, state = step(loop_inputs, i, state, kernels)
        position += 1
        if streamer is not None:
            emitted = ops.convert_to_numpy(state.sampler.emitted)
            if np.any(emitted >= 0):
                streamer(emitted)
    return compile_lib.to_numpy(sampler._outputs(state))
