"""TensorFlow SavedModels: serving signatures for the forward pass and, for LMs, `generate`.

Axes: B batch, K beams, R = B * K rows, P prompt width, N new tokens, L token buffer, S_enc
source length, V vocabulary.

Signatures (all also callable as `loaded.<name>(...)`; the first is `serving_default`):
    forward        the task's own inputs and dtypes (token_ids int32, padding_mask bool, ...)
                   -> {"logits": ...} ("embeddings" for a TextEmbedder; encoder tasks add the backbone's outputs).
    generate       (LMs) greedy decoding or random sampling, ids in, ids out. Inputs:
                   causal LMs: token_ids (B, P) int32, padding_mask (B, P) bool (right-padded prompts,
                   the start token included); seq2seq LMs: encoder_token_ids (B, S_enc) int32,
                   encoder_padding_mask (B, S_enc) bool; then the scalars max_new_tokens int32,
                   temperature float32 (<= 0: greedy; > 0: random sampling), top_k int32 (<= 0: off),
                   top_p float32 (>= 1: off), seed int32, min_new_tokens int32, repetition_penalty
                   float32 (1: off).
                   -> {"token_ids": (B, P + N) int32, "padding_mask": (B, P + N) bool}: each row's
                   prompt then its new tokens (up to N, the end token included), then padding.
                   Seq2seq outputs hold the decoder start token then the new tokens (P = 1).
    generate_beam  (LMs) beam search with `num_beams` beams (fixed at export, recorded in
                   generation_config.json under "saved_model"), early_stopping=False, the best
                   hypothesis per input. Inputs: the prompts as above, then max_new_tokens int32,
                   length_penalty float32, min_new_tokens int32, repetition_penalty float32.
                   -> {"token_ids", "padding_mask"} as above and "scores" (B,) float32, the
                   hypothesis' sum of log-probabilities / length ** length_penalty.

The `generate` signatures run the Keras decoding loop itself (`decoding/decode_loop.py`'s
`trace_prepare` and `trace_run`, the code `lm.generate` compiles on every backend), traced
here under TensorFlow with every shape dynamic: the same samplers, logits processors (repetition
penalty, min_new_tokens; the end token stops a row) and noise (a hash of (seed, step, row),
see `samplers/noise.py`), so a seed gives the tokens `RandomSampler(seed=...)` gives in Keras
and in the ONNX bundle. The loop is traced once, its shapes dynamic: each call's token buffer and
cache hold L = longest prompt + max_new_tokens positions (a short call never pays for max_length, and
the graph holds one loop, not one per static length), the prompt's first longest - 1 positions are
prefilled in one pass, and the steps start at the shortest prompt. Greedy and random decoding share
that loop (the token chosen in the step). Beam search reorders the cache's rows as the
PyTorch loop does (the compiled backends' slot cache needs a static batch). The graph runs
without XLA (the loaded model needs no compiler). In every signature, `forward` included, each layer
with weights runs as a function of its weights shared by the layers of its kind (`SharedLayerCalls`): the
graphs hold an encoder or decoder block once per input shape, not once per layer at every call.

The SavedModel depends on TensorFlow only: `tf.saved_model.load(path)` works in a process
that never imports Keras or keras_transformer. The tokenizer files and
`generation_config.json` are written next to `saved_model.pb`.

Runs under the TensorFlow backend (see `keras_transformer.export`).
"""

from keras_transformer.export import graphs as graph_lib
from keras_transformer.export.shared_layer_calls import SharedLayerCalls
from keras_transformer.presets import write_json
from keras_transformer.export.onnx import GENERATION_CONFIG_FILE, generation_config
from keras_transformer.decoding import DecodeOptions, LoopInputs, PrefillInputs, trace_prepare, trace_run
from keras_transformer.decoding.decode_loop import refresh_after
from keras_transformer.samplers import (
    BeamSampler,
    GreedySampler,
    RandomSampler,
    keep_nucleus,
    keep_top_k,
    sample_categorical,
)

# Beams of the `generate_beam` signature when the task's own sampler is not a beam search.
NUM_BEAMS = 4


def write_saved_model(task, directory):
    """Write the SavedModel of `task` into the existing empty `directory`."""
    import tensorflow as tf

    kind = graph_lib.model_kind(task)
    input_names = list(task.input)
    specs = [
        tf.TensorSpec((None,) * len(task.input[name].shape), task.input[name].dtype, name=name) for name in input_names
    ]

    layer_calls = SharedLayerCalls()  # one per export: every signature calls the same layer functions

    def forward(*args):
        inputs = dict(zip(input_names, args))
        logits = layer_calls.model(task, inputs)
        outputs = {getattr(task, "output_name", "logits"): logits}  # a TextEmbedder's: "embeddings"
        if kind == "encoder":
            outputs.update(layer_calls.model(task.backbone, {name: inputs[name] for name in task.backbone.input}))
        return outputs

    endpoints = {"forward": (forward, specs)}
    config = None
    if kind != "encoder":
        config = generation_config(task)
        sampler = getattr(task, "sampler", None)
        num_beams = sampler.num_beams if isinstance(sampler, BeamSampler) and sampler.num_beams > 1 else NUM_BEAMS
        endpoints.update(_generate_endpoints(_ServedLoop(task, config, num_beams, layer_calls), kind))
        config["saved_model"] = {"num_beams": num_beams, "early_stopping": False}
    _save(directory, endpoints)
    if task.preprocessor is not None:
        task.preprocessor.tokenizer.save(directory)
    if config is not None:
        write_json(f"{directory}/{GENERATION_CONFIG_FILE}", config)


def _generate_endpoints(served, kind):
    """{"generate" | "generate_beam": (function, input specs)} of an LM's `_ServedLoop`."""
    import tensorflow as tf

    names = ("token_ids", "padding_mask") if kind == "decoder" else ("encoder_token_ids", "encoder_padding_mask")
    prompts = [
        tf.TensorSpec((None, None), tf.int32, name=names[0]),
        tf.TensorSpec((None, None), tf.bool, name=names[1]),
    ]

    def scalars(**dtypes):
        return [tf.TensorSpec((), dtype, name=name) for name, dtype in dtypes.items()]

    common = scalars(min_new_tokens=tf.int32, repetition_penalty=tf.float32)
    sampling = scalars(max_new_tokens=tf.int32, temperature=tf.float32, top_k=tf.int32, top_p=tf.float32, seed=tf.int32)
    beam = scalars(max_new_tokens=tf.int32, length_penalty=tf.float32)
    return {
        "generate": (served.generate, prompts + sampling + common),
        "generate_beam": (served.generate_beam, prompts + beam + common),
    }


def _save(directory, endpoints):
    """Trace each endpoint once and save them as the SavedModel's signatures (the first also `serving_default`)
    and its functions (`loaded.<name>(...)`), with the variables they read, each stored once.

    Not Keras's `ExportArchive`: it traces every function a second time inside `tf.saved_model.save` (the save
    context is part of a `tf.function`'s cache key; a concrete function is not retraced), and stores the Keras
    variables besides the TensorFlow ones the functions read: each weight written twice.
    """
    import tensorflow as tf

    module = tf.Module()
    functions = {}
    for name, (function, specs) in endpoints.items():
        functions[name] = tf.function(function, input_signature=specs, autograph=False).get_concrete_function()
        setattr(module, name, functions[name])
    variables = {id(v): v for function in functions.values() for v in function.variables}
    module.endpoint_variables = list(variables.values())
    signatures = dict(functions, serving_default=functions[next(iter(endpoints))])
    tf.saved_model.save(module, str(directory), signatures=signatures)


class _ServedRandomSampler(RandomSampler):
    """`RandomSampler` with the signature's tensors as its settings: top_k <= 0 and top_p >= 1 are off, and a
    temperature <= 0 picks `GreedySampler`'s token (the argmax; the step's noise unused).

    The same filters and draw as `RandomSampler.get_next_token`; each filter runs only when on. Greedy and
    random decoding are one loop (the choice made in the step), not two: each loop is the model traced once more.
    """

    def __init__(self, temperature, top_k, top_p):  # tensors: no validation here (see `_checks`)
        self.temperature, self.top_k, self.top_p, self.seed = temperature, top_k, top_p, None

    def get_next_token(self, logits, uniform):
        import tensorflow as tf

        return tf.cond(
            self.temperature > 0.0,
            lambda: self._sample(logits, uniform),
            lambda: GreedySampler().get_next_token(logits, uniform),
        )

    def _sample(self, logits, uniform):
        import tensorflow as tf

        logits = logits / self.temperature  # (R, V)
        vocabulary_size = logits.shape[-1]
        top_k = tf.minimum(tf.maximum(self.top_k, 1), vocabulary_size)
        logits = tf.cond(
            (self.top_k > 0) & (self.top_k < vocabulary_size), lambda: keep_top_k(logits, top_k), lambda: logits
        )
        logits = tf.cond(self.top_p < 1.0, lambda: keep_nucleus(logits, self.top_p), lambda: logits)
        return sample_categorical(logits, uniform)


class _ServedBeamSampler(BeamSampler):
    """`BeamSampler` whose length penalty is the signature's tensor (early_stopping=False, one result)."""

    def __init__(self, num_beams, length_penalty):
        super().__init__(num_beams=num_beams)
        self.length_penalty = length_penalty


class _ServedLoop:
    """The `generate` signatures' functions: the signature's inputs -> the Keras loop's inputs -> its outputs."""

    def __init__(self, task, config, num_beams, layer_calls):
        self.task = task
        self.kind = config["kind"]
        self.max_length = config["max_length"]
        self.pad = config["pad_token_id"] or 0
        self.stop_ids = () if config["eos_token_id"] is None else (int(config["eos_token_id"]),)
        if config.get("stop_token_ids") is not None:  # the model's generation config's end tokens, as "auto"
            self.stop_ids = tuple(int(token) for token in config["stop_token_ids"])
        self.start_id = config.get("decoder_start_token_id")
        self.num_beams = num_beams
        self.options = DecodeOptions(stop_token_ids=self.stop_ids, pad_id=self.pad, repetition=True, flat_cache=False)
        self.layer_calls = layer_calls  # how the steps call the layers (a `SharedLayerCalls`)

    # --- signatures ------------------------------------------------------------

    def generate(
        self,
        token_ids,
        padding_mask,
        max_new_tokens,
        temperature,
        top_k,
        top_p,
        seed,
        min_new_tokens,
        repetition_penalty,
    ):
        import tensorflow as tf

        checks = [
            tf.debugging.assert_greater_equal(top_k, 0, message="top_k must be >= 0 (0: off)"),
            tf.debugging.assert_greater(top_p, 0.0, message="top_p must be in (0, 1] (1: off)"),
        ]
        with tf.control_dependencies(checks):
            temperature = tf.identity(temperature)
        sampler = _ServedRandomSampler(temperature, top_k, top_p)  # greedy when temperature <= 0
        outputs = self._generate(
            sampler, seed, token_ids, padding_mask, max_new_tokens, min_new_tokens, repetition_penalty
        )
        return {"token_ids": outputs["token_ids"], "padding_mask": outputs["padding_mask"]}

    def generate_beam(
        self, token_ids, padding_mask, max_new_tokens, length_penalty, min_new_tokens, repetition_penalty
    ):
        sampler = _ServedBeamSampler(self.num_beams, length_penalty)
        return self._generate(
            sampler, None, token_ids, padding_mask, max_new_tokens, min_new_tokens, repetition_penalty
        )

    # --- the loop ----------------------------------------------------------------

    def _generate(self, sampler, seed, ids, mask, max_new_tokens, min_new_tokens, repetition_penalty):
        import tensorflow as tf

        batch = tf.shape(ids)[0]
        encoder = None
        if self.kind == "decoder":
            lengths = tf.reduce_sum(tf.cast(mask, tf.int32), axis=1)  # (B,)
            prompts = tf.where(mask, ids, self.pad)  # (B, P)
        else:
            encoder = {"encoder_token_ids": ids, "encoder_padding_mask": mask}
            lengths = tf.ones((batch,), tf.int32)  # the decoder's prompt: its start token
            prompts = tf.fill([batch, 1], self.start_id)
        longest = tf.reduce_max(lengths)
        checks = self._checks(ids, lengths, longest, max_new_tokens, min_new_tokens, repetition_penalty)
        with tf.control_dependencies(checks):
            longest = tf.identity(longest)

        # One loop, traced once, its shapes dynamic: a buffer and cache of L = longest + max_new_tokens
        # positions (a short call never pays for max_length), and a prefill of the first longest - 1
        # positions (none for one-token prompts); the loop's steps then start at the shortest prompt.
        length = longest + max_new_tokens
        tokens = _to_width(prompts, length, self.pad)  # (B, L)
        width = longest - 1
        refresh = refresh_after(self.task.backbone)
        if refresh is not None:  # the loop computes a stale cache again at N + 1: a prefill within N (generate.py)
            width = tf.where(tf.reduce_min(lengths) <= refresh + 1, tf.minimum(width, refresh), width)
        prefill = tokens[:, :width] if self.kind == "decoder" else tokens[:, :0]  # (B, P)
        prepared = trace_prepare(
            self.task if encoder is None else _EncoderThrough(self.task, self.layer_calls),
            PrefillInputs(prompt_token_ids=tokens, prefill_token_ids=prefill, **(encoder or {})),
            call_layer=self.layer_calls,
        )
        K = sampler.num_beams
        rows = tf.repeat(tokens, K, axis=0)  # (B, L) -> (R, L)
        start = tf.reduce_min(lengths)
        inputs = LoopInputs(
            token_ids=rows,
            prompt_lengths=tf.repeat(lengths, K),  # (R,)
            start=start,
            max_new_tokens=max_new_tokens,
            min_new_tokens=min_new_tokens,
            repetition_penalty=repetition_penalty,
            seen=_seen(rows, start, self.task.backbone.vocabulary_size),  # (R, V) the tokens before step `start`
        )
        if isinstance(sampler, RandomSampler):  # the loop hashes (seed, step, row) into its noise
            inputs = inputs._replace(seed=seed)
        outputs = trace_run(self.task, sampler, self.options, inputs, prepared, call_layer=self.layer_calls)
        if K == 1:
            buffers = {"token_ids": outputs["token_ids"], "scores": tf.zeros((batch,), tf.float32)}  # (B, L)
            buffers["ends"] = _ends(buffers["token_ids"], lengths, max_new_tokens, self.stop_ids)
        else:
            buffers = {name: outputs[name][:, 0] for name in ("token_ids", "ends", "scores")}  # the best hypothesis
        width = tf.shape(prompts)[1] + max_new_tokens  # the output's P + N
        return _cut(buffers, width, self.pad)

    def _checks(self, ids, lengths, longest, max_new_tokens, min_new_tokens, repetition_penalty):
        import tensorflow as tf

        limit = self.max_length
        checks = [
            tf.debugging.assert_positive(max_new_tokens, message="max_new_tokens must be >= 1"),
            tf.debugging.assert_non_negative(min_new_tokens, message="min_new_tokens must be >= 0"),
            tf.debugging.assert_positive(repetition_penalty, message="repetition_penalty must be > 0"),
            tf.debugging.assert_less_equal(
                longest + max_new_tokens,
                limit,
                message=f"the longest prompt plus max_new_tokens exceeds max_length={limit}",
            ),
        ]
        if self.kind == "decoder":
            checks.append(
                tf.debugging.assert_positive(lengths, message="every prompt needs at least one token (the start token)")
            )
        else:
            checks.append(
                tf.debugging.assert_less_equal(
                    tf.shape(ids)[1], limit, message=f"a source is longer than max_length={limit}"
                )
            )
        return checks


class _EncoderThrough:
    """A seq2seq task as `trace_prepare` reads it, its encoder's layers called through `call_layer` as the steps'
    are (decoding's `prepare` calls `task.encode(ids, mask)`): every signature then calls the one function of each
    kind of encoder block, not a copy of every block."""

    def __init__(self, task, call_layer):
        self._task, self._call_layer = task, call_layer

    def __getattr__(self, name):
        return getattr(self._task, name)

    def encode(self, encoder_token_ids, encoder_padding_mask):
        return self._task.encode(encoder_token_ids, encoder_padding_mask, call_layer=self._call_layer)


def _to_width(x, width, pad):
    """(B, P) -> (B, width) with a static width: cut, or right-padded with `pad`."""
    import tensorflow as tf

    return tf.pad(x, [[0, 0], [0, tf.maximum(width - tf.shape(x)[1], 0)]], constant_values=pad)[:, :width]


def _seen(rows, start, vocabulary_size):
    """(R, V) bool: which tokens each row holds before position `start` (the repetition penalty's memory)."""
    import tensorflow as tf

    num_rows, length = tf.shape(rows)[0], tf.shape(rows)[1]
    target = tf.where(tf.range(length)[None, :] < start, rows, vocabulary_size)  # (R, L): V past `start`
    row_index = tf.broadcast_to(tf.range(num_rows)[:, None], tf.shape(rows))
    indices = tf.reshape(tf.stack([row_index, target], axis=-1), (-1, 2))  # (R * L, 2)
    counts = tf.scatter_nd(indices, tf.ones(tf.shape(indices)[:1], tf.int32), [num_rows, vocabulary_size + 1])
    return counts[:, :vocabulary_size] > 0


def _ends(buffer, lengths, max_new_tokens, stop_ids):
    """(B,) position after each row's last token: its prompt, then up to max_new_tokens, cut after a stop token."""
    import tensorflow as tf

    length = tf.shape(buffer)[1]
    columns = tf.range(length)[None, :]  # (1, L)
    limit = lengths + max_new_tokens
    generated = (columns >= lengths[:, None]) & (columns < limit[:, None])  # (B, L)
    stops = tf.zeros_like(generated)
    for token_id in stop_ids:
        stops |= generated & tf.equal(buffer, token_id)
    first_stop = tf.reduce_min(tf.where(stops, columns, length), axis=1)  # (B,), L where none
    return tf.minimum(limit, first_stop + 1)


def _cut(buffers, width, pad):
    """{"token_ids" (B, L), "ends" (B,), "scores"} -> the signature's outputs, (B, width) each."""
    import tensorflow as tf

    buffer, ends = buffers["token_ids"], buffers["ends"]
    buffer = tf.pad(buffer, [[0, 0], [0, tf.maximum(width - tf.shape(buffer)[1], 0)]])[:, :width]
    mask = tf.range(width)[None, :] < ends[:, None]
    return {"token_ids": tf.where(mask, buffer, pad), "padding_mask": mask, "scores": buffers["scores"]}
