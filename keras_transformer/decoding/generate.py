"""`generate` for causal and encoder-decoder LMs: read and check the inputs, run the loop, shape the outputs.

Axes: B inputs, K beams, R = B * K rows, L token buffer length (a bucket), P prefill length, S_enc encoder length.
Everything here is host-side numpy; the compiled loop lives in `decode_loop.py`, run by `decode.py`.
"""

import dataclasses
from typing import Any, NamedTuple

import numpy as np

from keras_transformer.decoding.decode import decode
from keras_transformer.decoding.decode_loop import refresh_after
from keras_transformer.decoding.decode_inputs import DecodeInputs, LoopInputs, PrefillInputs
from keras_transformer.decoding.decode_options import DecodeOptions
from keras_transformer.decoding.generate_inputs import (
    LENGTH_BUCKET,
    PREFILL_BUCKET,
    decoder_start_token_id,
    encoder_inputs,
    read_inputs,
    round_up,
    stop_token_ids,
)
from keras_transformer.decoding.generate_options import GenerateOptions
from keras_transformer.decoding.generate_outputs import chosen_logprobs, cut_results, format_results
from keras_transformer.decoding.generation_config import GenerationConfig
from keras_transformer.decoding.loop_state import ABSENT, present
from keras_transformer.decoding.speculation import Speculation
from keras_transformer.decoding.speculative_decode import speculative_decode
from keras_transformer.samplers.greedy_sampler import GreedySampler
from keras_transformer.samplers.random_sampler import RandomSampler
from keras_transformer.samplers.registry import get

__all__ = ["LENGTH_BUCKET", "PREFILL_BUCKET", "generate", "generate_with"]


def generate(
    task,
    inputs,
    max_new_tokens=32,
    sampler=None,
    stop_token_ids="auto",
    min_new_tokens=0,
    repetition_penalty=None,
    no_repeat_ngram_size=0,
    streamer=None,
    return_dict=False,
    output_logits=False,
    prompt_lookup_num_tokens=None,
    max_matching_ngram_size=None,
    draft_model=None,
    num_draft_tokens=None,
):
    """Generate from a causal LM (continue prompts) or a seq2seq LM (transduce sources).

    See `LanguageModel.generate` (models/language_model.py) for the arguments and return values.
    """
    options = GenerateOptions(
        max_new_tokens=max_new_tokens,
        sampler=sampler,
        stop_token_ids=stop_token_ids,
        min_new_tokens=min_new_tokens,
        repetition_penalty=repetition_penalty,
        no_repeat_ngram_size=no_repeat_ngram_size,
        streamer=streamer,
        return_dict=return_dict,
        output_logits=output_logits,
        prompt_lookup_num_tokens=prompt_lookup_num_tokens,
        max_matching_ngram_size=max_matching_ngram_size,
        draft_model=draft_model,
        num_draft_tokens=num_draft_tokens,
    )
    return generate_with(task, inputs, options)


class _Call(NamedTuple):
    """One call's inputs, read and checked: the prompts the loop continues, and for seq2seq the sources."""

    form: str  # how the results must look (`generate_outputs.format_results`)
    prompts: list  # B id lists: the prompts, or each source's decoder start token
    pad_id: int
    stop_ids: tuple
    encoder_token_ids: Any = ABSENT  # (B, S_enc) int32
    encoder_padding_mask: Any = ABSENT  # (B, S_enc) bool


def with_model_defaults(task, options):
    """`options` with what the caller left to the model filled in: the sampler `compile` set, else the task's
    `generation_config`'s, else greedy; "auto" stop tokens from the generation config when it names them; the
    repetition penalty from it, else 1.0."""
    defaults = getattr(task, "generation_config", None) or GenerationConfig()
    sampler = options.sampler
    if sampler is None:
        sampler = getattr(task, "sampler", None) or defaults.sampler or "greedy"
    stop = options.stop_token_ids
    if isinstance(stop, str) and stop == "auto" and defaults.stop_token_ids is not None:
        stop = list(defaults.stop_token_ids)
    penalty = options.repetition_penalty
    if penalty is None:
        penalty = defaults.repetition_penalty if defaults.repetition_penalty is not None else 1.0
    return dataclasses.replace(options, sampler=sampler, stop_token_ids=stop, repetition_penalty=penalty)


def generate_with(task, inputs, options):
    """`generate` with its options as a `GenerateOptions`."""
    options = with_model_defaults(task, options)
    sampler = get(options.sampler)
    if options.streamer is not None and sampler.reorders_rows:
        raise ValueError("`streamer` is not supported with beam search: the best beam is known only at the end.")
    if options.output_logits and (not options.return_dict or sampler.reorders_rows):
        raise ValueError(
            "`output_logits=True` needs `return_dict=True` and a sampler other than beam search. "
            f"Received: return_dict={options.return_dict}, sampler={sampler!r}"
        )
    call = _read_call(task, inputs, options)
    decode_options = DecodeOptions(
        stop_token_ids=call.stop_ids,
        pad_id=call.pad_id,
        repetition=options.repetition_penalty != 1.0,
        no_repeat_ngram_size=options.no_repeat_ngram_size,
        return_logits=options.output_logits,
        streaming=options.streamer is not None,
    )
    arrays = _decode_inputs(call, sampler, options, task.backbone)
    speculation = _speculation(task, sampler, options)
    if speculation is None:
        outputs = decode(task, sampler, decode_options, arrays, streamer=options.streamer)
    else:
        source = ABSENT  # a seq2seq model's source, which prompt lookup matches before the output
        if present(call.encoder_token_ids):
            source = np.where(call.encoder_padding_mask, call.encoder_token_ids, -1).astype("int32")
        if options.draft_model is not None:
            source = ABSENT
        outputs = speculative_decode(
            task, sampler, decode_options, speculation, arrays, source, options.streamer, options.draft_model
        )
    results, scores, logits = cut_results(outputs, call.prompts, sampler, options.max_new_tokens, call.stop_ids)
    logprobs = chosen_logprobs(results, call.prompts, logits)
    results = format_results(task, call.form, results, sampler.num_return_sequences, call.pad_id)
    if not options.return_dict:
        return results
    return {"outputs": results, "scores": scores, "logits": logits, "logprobs": logprobs}


def _speculation(task, sampler, options):
    """The call's `Speculation`, or None for plain decoding; what speculation cannot take is an error."""
    if options.prompt_lookup_num_tokens is None and options.draft_model is None:
        return None
    asked = (
        f"prompt_lookup_num_tokens={options.prompt_lookup_num_tokens}"
        if options.draft_model is None
        else f"draft_model={type(options.draft_model).__name__}"
    )
    if sampler.reorders_rows:
        raise ValueError(f"Speculative decoding does not run with beam search. Received: {asked}, sampler={sampler!r}")
    if not isinstance(sampler, (GreedySampler, RandomSampler)):
        raise ValueError(
            "Speculative decoding runs with greedy decoding or a RandomSampler (the rejection rule). "
            f"Received: {asked}, sampler={sampler!r}"
        )
    if options.draft_model is None:
        return Speculation(options.prompt_lookup_num_tokens, options.max_matching_ngram_size or 2)
    _check_draft(task, options.draft_model)
    return Speculation(options.num_draft_tokens or 5)


def _check_draft(task, draft):
    """A draft model must be a language model of the same kind (causal or seq2seq), vocabulary and length."""
    kind = "a seq2seq LM" if hasattr(task, "compute_cross_cache") else "a causal LM"
    if not hasattr(draft, "call_with_cache") or hasattr(draft, "compute_cross_cache") != hasattr(
        task, "compute_cross_cache"
    ):
        raise ValueError(f"`draft_model` must be {kind}, as the model is. Received: draft_model={draft!r}")
    ours, theirs = task.backbone.vocabulary_size, draft.backbone.vocabulary_size
    if ours != theirs:
        raise ValueError(
            f"`draft_model` must have the model's vocabulary: vocabulary_size={ours}. Received: draft_model with "
            f"vocabulary_size={theirs}"
        )
    ours, theirs = task.backbone.max_sequence_length, draft.backbone.max_sequence_length
    if theirs < ours:
        raise ValueError(
            f"`draft_model` must take as many positions as the model: max_sequence_length >= {ours}. Received: "
            f"draft_model with max_sequence_length={theirs}"
        )


def _read_call(task, inputs, options):
    """`generate`'s inputs -> a `_Call`; a source or a prompt longer than the model allows is an error."""
    backbone = task.backbone
    max_length = backbone.max_sequence_length
    tokenizer = getattr(task.preprocessor, "tokenizer", None) if task.preprocessor is not None else None
    pad_id = tokenizer.pad_token_id if tokenizer is not None and tokenizer.pad_token_id is not None else 0
    stop_ids = stop_token_ids(options.stop_token_ids, tokenizer, backbone.vocabulary_size)
    form, rows = read_inputs(task, inputs, backbone.vocabulary_size)
    call = _Call(form, rows, pad_id, stop_ids)
    if hasattr(task, "compute_cross_cache"):  # seq2seq: the rows are sources, the prompts start tokens
        encoder_ids, encoder_mask = encoder_inputs(task, form, inputs, rows, pad_id)
        if encoder_ids.shape[1] > max_length:
            raise ValueError(
                f"A source of {encoder_ids.shape[1]} tokens is longer than the model's "
                f"max_sequence_length={max_length}."
            )
        call = call._replace(
            prompts=[[decoder_start_token_id(task)]] * len(rows),
            encoder_token_ids=encoder_ids,
            encoder_padding_mask=encoder_mask,
        )
    longest, max_new_tokens = max(len(p) for p in call.prompts), options.max_new_tokens
    if longest + max_new_tokens > max_length:
        raise ValueError(
            f"The longest prompt ({longest} tokens) plus `max_new_tokens`={max_new_tokens} is longer than "
            f"the model's max_sequence_length={max_length}. Received: max_new_tokens={max_new_tokens}"
        )
    return call


def _decode_inputs(call, sampler, options, backbone):
    """The loop's numpy inputs (`DecodeInputs`): right-padded token buffers (per input and per beam row),
    lengths, the per-call scalars and the noise seed."""
    prompts, num_beams = call.prompts, sampler.num_beams
    prompt_lengths = np.array([len(p) for p in prompts], "int32")
    longest, start = int(prompt_lengths.max()), int(prompt_lengths.min())
    length = min(round_up(longest + options.max_new_tokens, LENGTH_BUCKET), backbone.max_sequence_length)
    # The prefill covers every prompt but the last token of the longest (bucketed): positions past a
    # shorter prompt hold pad keys, which the steps overwrite before any query reads them.
    prefill = 0 if longest == 1 else min(round_up(longest - 1, PREFILL_BUCKET), length)
    refresh = refresh_after(backbone)
    if refresh is not None and start <= refresh + 1:
        # Its cache goes stale at N (longrope) and the loop computes it again at the step i = N + 1: the prefill
        # stays within N, so that a shorter prompt's keys take the factors of its own length.
        prefill = min(prefill, refresh)
    tokens = np.full((len(prompts), length), call.pad_id, "int32")  # (B, L)
    for row, prompt in enumerate(prompts):
        tokens[row, : len(prompt)] = prompt
    rows = np.repeat(tokens, num_beams, axis=0)  # (B, L) -> (R, L)
    seen = ABSENT
    if options.repetition_penalty != 1.0:  # (R, V): the tokens before the first step, per row
        seen = np.zeros((len(rows), backbone.vocabulary_size), bool)
        for row, ids in enumerate(rows):
            seen[row, ids[:start]] = True
    seed = sampler.draw_seed()  # the loop hashes (seed, step, row) into its noise (see `noise.py`)
    loop = LoopInputs(
        token_ids=rows,
        prompt_lengths=np.repeat(prompt_lengths, num_beams),  # (R,)
        start=np.array(start, "int32"),
        max_new_tokens=np.array(options.max_new_tokens, "int32"),
        min_new_tokens=np.array(options.min_new_tokens, "int32"),
        repetition_penalty=np.array(options.repetition_penalty, "float32"),
        seen=seen,
        seed=ABSENT if seed is None else np.array(seed, "int32"),
    )
    prefill_inputs = PrefillInputs(tokens, tokens[:, :prefill], call.encoder_token_ids, call.encoder_padding_mask)
    return DecodeInputs(prefill_inputs, loop)
