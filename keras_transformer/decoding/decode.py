"""`decode`: run the compiled prefill and decoding loop on a call's numpy inputs (see `decode_loop.py`).

Axes: B inputs, K beams, R = B * K decoded rows, L token buffer length, P prefill length.
"""

import keras
import numpy as np
from keras import ops

from keras_transformer.decoding import compile as compile_lib
from keras_transformer.decoding.cache_schedule import cache_width, cache_widths, widen
from keras_transformer.decoding.decode_loop import LoopSpec, cache_dtype, is_seq2seq, one_step, outputs, prepare
from keras_transformer.decoding.decode_loop import refresh_after, run, start, step


def decode(task, sampler, options, inputs, streamer=None):
    """Run the compiled prefill and loop on numpy `inputs`; returns the sampler's outputs as numpy.

    Args:
        task: a `CausalLM` or `Seq2SeqLM`.
        sampler: a `Sampler`.
        options: `DecodeOptions` with what the caller asks for; `compile.plan` completes how it runs.
        inputs: a `DecodeInputs` of numpy arrays (see `decode_inputs.py`).
        streamer: None, or a callable receiving after every step the (R,) numpy array of
            the token each row produced (-1 where a row produced none).
    """
    rows, length = inputs.loop.token_ids.shape
    bits = int("".join(c for c in cache_dtype(task) if c.isdigit()))  # float32 -> 32, bfloat16 -> 16
    cache_bytes = int(np.prod(task.backbone.cache_shape(rows, length))) * bits // 8
    plan = compile_lib.plan(task, sampler, options, (rows, length), cache_bytes)
    spec, kernels = LoopSpec(task, sampler, plan.options), plan.kernels
    one_call = streamer is None and not plan.stepwise  # else the host runs the steps, each reading the inputs
    prefill_inputs, loop_inputs = (
        compile_lib.device_inputs(inputs.prefill),
        compile_lib.device_inputs(inputs.loop, not one_call),
    )
    prepared = prepare_compiled(spec, plan, prefill_inputs)
    key = (sampler._trace_key(), spec.options)
    if one_call:
        loop = compile_lib.compiled(task, ("run",) + key, lambda: lambda x, p, k: run(spec, x, p, k))
        return compile_lib.to_numpy(loop(loop_inputs, prepared, kernels))
    begin = compile_lib.compiled(task, ("start",) + key, lambda: lambda x, p: start(spec, x, p))
    if plan.stepwise:  # each step one compiled graph (PyTorch)
        one = compile_lib.compiled(
            task, ("step", length) + key, lambda: lambda x, i, s, k: step(spec, x, i, s, k), step=True
        )
    else:  # the loop's step as a one-iteration loop (XLA), so that the streamer sees every token
        one = compile_lib.compiled(task, ("step",) + key, lambda: lambda x, i, s, k: one_step(spec, x, i, s, k))
    # A model whose cache goes stale at N runs the step i = N + 1 as `decode_loop._refresh_step` (not compiled
    # by torch.compile: it runs once per call).
    refresh = refresh_after(task.backbone)
    again = compile_lib.compiled(task, ("refresh",) + key, lambda: lambda x, i, s, k: step(spec, x, i, s, k, True))
    i, state = begin(loop_inputs, prepared)
    widths = cache_widths(length, cache_width(state), spec.options.chunked_cache)
    position = int(ops.convert_to_numpy(i))
    while position < length and bool(ops.convert_to_numpy(sampler._is_running(state))):
        state = widen(state, next(w for w in widths if w >= position))  # step i writes at i - 1
        i, state = (again if refresh is not None and position == refresh + 1 else one)(loop_inputs, i, state, kernels)
        position += 1
        if streamer is not None:
            emitted = ops.convert_to_numpy(state.sampler.emitted)
            if np.any(emitted >= 0):
                streamer(emitted)
    return compile_lib.to_numpy(outputs(spec, state))


def prepare_compiled(spec, plan, inputs):
    """The encoder (seq2seq) and the prefill, compiled.

    The kernels are an argument (PyTorch only). A compiled PyTorch prefill is one graph per input shape
    (prompt and prefill buckets, batch), as a step is one per (batch, cache width). A seq2seq encoder
    runs through Keras's layers, which do not compile as one graph (Keras's attention asks a pybind
    object whether flash attention applies): it stays eager, one pass per call.
    """
    task = spec.task
    compiled_prefill = plan.stepwise and not is_seq2seq(task)
    shapes = tuple(tuple(x.shape) for x in keras.tree.flatten(inputs)) if compiled_prefill else ()
    prefill = compile_lib.compiled(
        task, ("prepare",) + shapes, lambda: lambda x, k: prepare(task, x, k), step=compiled_prefill
    )
    return prefill(inputs, plan.kernels)
