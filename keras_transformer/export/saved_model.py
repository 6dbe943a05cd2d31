"""TensorFlow SavedModels: serving signatures for the forward pass and, for LMs, `generate`.

Axes: B batch, P prompt length, N new tokens, S_enc source length, V vocabulary.

Signatures (all also callable as `loaded.<name>(...)`; the first is `serving_default`):
    forward   the task's own inputs and dtypes (token_ids int32, padding_mask bool, ...)
              -> {"logits": ...} (encoder tasks add the backbone's outputs).
    generate  (LMs) the decoding loop inside the graph, ids in, ids out:
              causal LMs: token_ids (B, P) int32, padding_mask (B, P) bool (right-padded prompts),
              seq2seq LMs: encoder_token_ids (B, S_enc) int32, encoder_padding_mask (B, S_enc) bool,
              and max_new_tokens () int32, temperature () float32 (<= 0: greedy; > 0: random
              sampling), top_k () int32 (0: off), top_p () float32 (>= 1: off), seed () int32
              -> {"token_ids": (B, P + N) int32, "padding_mask": (B, P + N) bool}: each row's prompt
              then its new tokens (up to N, the end token included), then padding. Seq2seq
              outputs hold the decoder start token then the new tokens.

The SavedModel depends on TensorFlow only: `tf.saved_model.load(path)` works in a process
that never imports Keras or keras_transformer. The tokenizer files and
`generation_config.json` are written next to `saved_model.pb`.

Runs under the TensorFlow backend (see `keras_transformer.export`).
"""

import keras

from keras_transformer.export import graphs as graph_lib
from keras_transformer.export.onnx import GENERATION_CONFIG_FILE, _write_json, generation_config


def write_saved_model(task, directory):
    """Write the SavedModel of `task` into the existing empty `directory`."""
    import tensorflow as tf

    kind = graph_lib.model_kind(task)
    archive = keras.export.ExportArchive()
    archive.track(task)
    input_names = list(task.input)
    specs = [tf.TensorSpec((None,) * len(task.input[name].shape), task.input[name].dtype, name=name)
             for name in input_names]

    def forward(*args):
        inputs = dict(zip(input_names, args))
        outputs = {"logits": task(inputs)}
        if kind == "encoder":
            outputs.update(task.backbone({name: inputs[name] for name in task.backbone.input}))
        return outputs

    archive.add_endpoint("forward", forward, input_signature=specs)
    if kind != "encoder":
        generate = _decoder_generate(task) if kind == "decoder" else _seq2seq_generate(task)
        prompt_names = ("token_ids", "padding_mask") if kind == "decoder" else ("encoder_token_ids", "encoder_padding_mask")
        archive.add_endpoint("generate", generate, input_signature=[
            tf.TensorSpec((None, None), tf.int32, name=prompt_names[0]),
            tf.TensorSpec((None, None), tf.bool, name=prompt_names[1]),
            tf.TensorSpec((), tf.int32, name="max_new_tokens"),
            tf.TensorSpec((), tf.float32, name="temperature"),
            tf.TensorSpec((), tf.int32, name="top_k"),
            tf.TensorSpec((), tf.float32, name="top_p"),
            tf.TensorSpec((), tf.int32, name="seed"),
        ])
    archive.write_out(str(directory), verbose=False)
    if task.preprocessor is not None:
        task.preprocessor.tokenizer.save(directory)
    if kind != "encoder":
        _write_json(f"{directory}/{GENERATION_CONFIG_FILE}", generation_config(task))


def _pick(logits, position, temperature, top_k, top_p, seed):
    """logits (B, V) -> one token per row (B,) int32: greedy when temperature <= 0, else sampled."""
    import tensorflow as tf

    def greedy():
        return tf.argmax(logits, axis=-1, output_type=tf.int32)

    def sample():
        scaled = logits / temperature
        vocabulary = tf.shape(scaled)[-1]
        k = tf.where(top_k > 0, tf.minimum(top_k, vocabulary), vocabulary)
        kth = tf.math.top_k(scaled, k=k).values[:, -1:]  # (B, 1)
        scaled = tf.where(scaled < kth, tf.constant(-float("inf")), scaled)
        # Nucleus: keep the smallest prefix of the sorted tokens whose probability reaches top_p.
        order = tf.argsort(scaled, axis=-1, direction="DESCENDING", stable=True)
        sorted_probs = tf.gather(tf.nn.softmax(scaled), order, batch_dims=1)
        before = tf.cumsum(sorted_probs, axis=-1, exclusive=True)
        keep_sorted = tf.logical_or(before < top_p, top_p >= 1.0)
        keep = tf.gather(keep_sorted, tf.argsort(order, axis=-1), batch_dims=1)  # back to vocabulary order
        scaled = tf.where(keep, scaled, tf.constant(-float("inf")))
        draws = tf.random.stateless_categorical(scaled, 1, seed=tf.stack([seed, position]), dtype=tf.int32)
        return draws[:, 0]

    return tf.cond(temperature > 0.0, sample, greedy)


def _decoding_loop(step, buffer, lengths, position, total, logits, cache, max_new_tokens, eos, sampling):
    """Choose and feed one token per row until every row is done (shared by causal and seq2seq LMs).

    buffer (B, total) int32 holds the prompts; `step(tokens (B, 1), cache, position)` returns
    (logits (B, 1, V), cache). Returns (buffer, generated mask (B, total)).
    """
    import tensorflow as tf

    batch = tf.shape(buffer)[0]
    columns = tf.range(total)[None, :]  # (1, total)

    def cond(position, buffer, generated, cache, logits, produced, done):
        finished = (position >= lengths) & ((produced >= max_new_tokens) | done)
        return (position < total) & ~tf.reduce_all(finished)

    def body(position, buffer, generated, cache, logits, produced, done):
        generating = (position >= lengths) & (produced < max_new_tokens) & ~done  # (B,)
        chosen = _pick(logits, position, *sampling)
        write = (columns == position) & generating[:, None]  # (B, total)
        buffer = tf.where(write, chosen[:, None], buffer)
        generated = generated | write
        produced += tf.cast(generating, tf.int32)
        if eos is not None:
            done = done | (generating & tf.equal(chosen, eos))
        token = tf.gather(buffer, position[None], axis=1)  # (B, 1): the prompt's or the chosen token
        next_logits, cache = step(token, cache, position)
        return position + 1, buffer, generated, cache, next_logits[:, 0], produced, done

    zeros = tf.zeros((batch,), tf.int32)
    _, buffer, generated, *_ = tf.while_loop(
        cond, body,
        (position, buffer, tf.zeros_like(buffer, tf.bool), cache, logits, zeros, tf.zeros((batch,), tf.bool)),
    )
    return buffer, generated


def _decoder_generate(task):
    import tensorflow as tf

    config = generation_config(task)
    eos, pad = config["eos_token_id"], config["pad_token_id"] or 0
    max_length = config["max_length"]

    def generate(token_ids, padding_mask, max_new_tokens, temperature, top_k, top_p, seed):
        lengths = tf.reduce_sum(tf.cast(padding_mask, tf.int32), axis=1)  # (B,)
        batch, prompt_length = tf.shape(token_ids)[0], tf.shape(token_ids)[1]
        total = prompt_length + max_new_tokens
        checks = [
            tf.debugging.assert_positive(lengths, message="Every prompt needs at least one token (the start token)."),
            tf.debugging.assert_less_equal(total, max_length,
                                           message=f"prompt length + max_new_tokens exceeds max_length={max_length}"),
        ]
        with tf.control_dependencies(checks):
            buffer = tf.where(padding_mask, token_ids, pad)
            buffer = tf.pad(buffer, [[0, 0], [0, max_new_tokens]], constant_values=pad)  # (B, P + N)
        start = tf.reduce_min(lengths)
        cache = tf.zeros(task.backbone.cache_shape(batch, total))
        # Prefill the positions every prompt has; later prompt tokens are fed one step at a time.
        logits, cache = task.call_with_cache(buffer[:, :start], cache, 0)

        def step(tokens, cache, position):
            return task.call_with_cache(tokens, cache, position)

        buffer, generated = _decoding_loop(step, buffer, lengths, start, total, logits[:, -1], cache,
                                           max_new_tokens, eos, (temperature, top_k, top_p, seed))
        prompt_mask = tf.pad(padding_mask, [[0, 0], [0, max_new_tokens]])
        mask = prompt_mask | generated
        return {"token_ids": tf.where(mask, buffer, pad), "padding_mask": mask}

    return generate


def _seq2seq_generate(task):
    import tensorflow as tf

    config = generation_config(task)
    eos, pad = config["eos_token_id"], config["pad_token_id"] or 0
    start_id = config["decoder_start_token_id"] if config["decoder_start_token_id"] is not None else pad

    def generate(encoder_token_ids, encoder_padding_mask, max_new_tokens, temperature, top_k, top_p, seed):
        batch = tf.shape(encoder_token_ids)[0]
        encoder_outputs = task.encode(encoder_token_ids, encoder_padding_mask)
        cross_cache = task.compute_cross_cache(encoder_outputs)
        total = max_new_tokens + 1
        buffer = tf.concat([tf.fill([batch, 1], start_id), tf.fill([batch, max_new_tokens], pad)], axis=1)
        cache = tf.zeros(task.backbone.cache_shape(batch, total))

        def step(tokens, cache, position):
            return task.call_with_cache(tokens, cache, position, cross_cache, encoder_padding_mask)

        logits, cache = step(buffer[:, :1], cache, 0)
        lengths = tf.ones((batch,), tf.int32)  # the start token is the decoder's prompt
        buffer, generated = _decoding_loop(step, buffer, lengths, tf.constant(1), total, logits[:, -1], cache,
                                           max_new_tokens, eos, (temperature, top_k, top_p, seed))
        mask = generated | (tf.range(total)[None, :] == 0)
        return {"token_ids": tf.where(mask, buffer, pad), "padding_mask": mask}

    return generate
