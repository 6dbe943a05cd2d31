"""`speculative_decode`: run the compiled prefill and speculative loop on a call's numpy inputs (see
`speculative_loop.py`); `decode.py`'s counterpart, a loop of its own so that the plain loop's graph is unchanged.

Axes: B inputs, R = B decoded rows, L token buffer length, K draft tokens, S_enc source length.
"""

import numpy as np
from keras import ops

from keras_transformer.decoding import compile as compile_lib
from keras_transformer.decoding.decode import prepare_compiled
from keras_transformer.decoding.decode_loop import LoopSpec, cache_dtype, refresh_after
from keras_transformer.decoding.loop_state import ABSENT, present
from keras_transformer.decoding.speculative_loop import speculative_one_step, speculative_outputs, speculative_run
from keras_transformer.decoding.speculative_loop import speculative_start, speculative_step


def speculative_decode(task, sampler, options, speculation, inputs, source=ABSENT, streamer=None, draft=None):
    """Run the compiled prefill and speculative loop on numpy `inputs`; returns the outputs as numpy:
    "token_ids" (R, L), "logits" (R, L, V) where asked, "steps" (the verify passes run).

    Args:
        task, sampler, options, inputs: as `decode`'s (the sampler greedy: `generate` checks it).
        speculation: a `Speculation`.
        source: ABSENT, or (R, S_enc) int32 numpy, a seq2seq model's source ids, -1 on padding, which
            prompt lookup matches before the output.
        streamer: None, or a callable receiving the (R,) numpy array of each position's tokens in order
            (-1 where a row produced none); a step that accepts several tokens calls it several times.
        draft: None (prompt lookup), or the draft model (a task of the same kind and vocabulary).
    """
    rows, length = inputs.loop.token_ids.shape
    _check_no_refresh(task, draft, int(inputs.loop.start), length)
    bits = int("".join(c for c in cache_dtype(task) if c.isdigit()))
    cache_bytes = int(np.prod(task.backbone.cache_shape(rows, length))) * bits // 8
    plan = compile_lib.plan(task, sampler, options, (rows, length), cache_bytes)
    plan.options = plan.options.replace(beam_cache=False, padded_step=False)  # K + 1 query rows already
    spec, kernels = LoopSpec(task, sampler, plan.options), plan.kernels
    one_call = streamer is None and not plan.stepwise  # else the host runs the steps, each reading the inputs
    prefill_inputs, loop_inputs = (
        compile_lib.device_inputs(inputs.prefill),
        compile_lib.device_inputs(inputs.loop, not one_call),
    )
    source = compile_lib.device_inputs(source, not one_call) if present(source) else ABSENT
    prepared = prepare_compiled(spec, plan, prefill_inputs)
    key = ("speculative", sampler._trace_key(), spec.options, speculation)
    others, draft_prepared, draft_kernels = (), ABSENT, None
    if draft is not None:  # its own compiled prefill; its variables read by the loop as the task's are
        draft_plan = compile_lib.plan(draft, sampler, options, (rows, length), cache_bytes)
        draft_prepared = prepare_compiled(LoopSpec(draft, sampler, draft_plan.options), draft_plan, prefill_inputs)
        others, draft_kernels = (draft,), draft_plan.kernels
        key += ("draft", id(draft), tuple(map(id, draft.variables)))

    def with_draft(kernels_of_draft):
        return None if draft is None else (draft, kernels_of_draft)

    if one_call:
        loop = compile_lib.compiled(
            task,
            ("run",) + key,
            lambda: lambda x, p, s, k, dk, dp: speculative_run(spec, speculation, x, p, s, k, with_draft(dk), dp),
            other_models=others,
        )
        return compile_lib.to_numpy(loop(loop_inputs, prepared, source, kernels, draft_kernels, draft_prepared))
    begin = compile_lib.compiled(
        task,
        ("start",) + key,
        lambda: lambda x, p, dp: speculative_start(spec, speculation, x, p, dp),
        other_models=others,
    )
    if plan.stepwise:  # each step one compiled graph (PyTorch)
        one = compile_lib.compiled(
            task,
            ("step", length) + key,
            lambda: lambda x, i, st, s, k, dk: speculative_step(spec, speculation, x, i, st, s, k, with_draft(dk)),
            step=True,
        )
    else:  # a one-iteration loop (XLA), so that the streamer sees every step
        one = compile_lib.compiled(
            task,
            ("step",) + key,
            lambda: lambda x, i, st, s, k, dk: speculative_one_step(spec, speculation, x, i, st, s, k, with_draft(dk)),
            other_models=others,
        )
    i, state = begin(loop_inputs, prepared, draft_prepared)
    while int(ops.convert_to_numpy(i)) < length and bool(ops.convert_to_numpy(sampler._is_running(state))):
        i, state = one(loop_inputs, i, state, source, kernels, draft_kernels)
        if streamer is not None:
            emitted = ops.convert_to_numpy(state.sampler.emitted)  # (R, K + 1)
            for column in emitted.T:
                if np.any(column >= 0):
                    streamer(column)
    return compile_lib.to_numpy(speculative_outputs(spec, state))


def _check_no_refresh(task, draft, start, length):
    """A model whose cache goes stale at N (`refresh_after`: longrope) computes its cache again at the step
    i = N + 1, which a verify window of several positions cannot do: a generation that crosses N is refused."""
    for model, name in ((task, "the model"), (draft, "the draft model")):
        after = None if model is None else refresh_after(model.backbone)
        if after is not None and start <= after + 1 < length:
            raise ValueError(
                f"Speculative decoding cannot cross position {after} of {name}, where its rotary frequencies "
                f"change (longrope's original_max_position_embeddings={after}) and its cache is computed again: "
                f"the prompts start at {start} and the generation runs to {length}. Generate without "
                "`prompt_lookup_num_tokens` / `draft_model`, or with prompts longer than that position."
            )
