"""The decode graph's step of T >= 1 tokens per row after a filled past (decode_graph.py, onnx_kernels.py): what a
prompt prefilled after a cached prefix (the server's prefix cache) and a speculative verify pass run.

For every layer-type combination the ONNX kernels build (GPT, the mixture of experts, the Llama / Gemma / Qwen3 /
Phi-3 variants of test_decode_kernels.py, T5's relative positions and the plain Transformer's cross-attention),
the graph's caches are written in place (IO binding, as the runtime runs it) over ragged pasts: each row's past
filled by T-token steps from position 0, then T more tokens after it (a row at a time: GroupQueryAttention takes
several tokens after a past in a batch of one), then one token per row for the whole batch at its own position.
Every step's logits are Keras's full forward pass's within 1e-4.
"""

import numpy as np
import onnxruntime
import pytest

from keras_transformer.export.decode_graph import decode_model
from keras_transformer.models.seq2seq_lm import Seq2SeqLM
from tests.export import helpers
from tests.export.test_decode_kernels import VARIANTS, _llama

pytestmark = pytest.mark.slow
ATOL = 1e-4
BUILDERS = {
    "gpt": helpers.tiny_gpt,
    "moe": helpers.tiny_moe,
    "t5": helpers.tiny_t5,
    "transformer": helpers.tiny_transformer,
    **{variant: lambda variant=variant: _llama(**VARIANTS[variant]) for variant in VARIANTS},
}
PASTS = (7, 3, 5)  # each row's past (positions 0 .. p - 1), filled by steps of 4 and 3 tokens
NEW = 4  # tokens after the past, in one step


class _Rows:
    """A session of the decode graph over in-place buffers (B, Hkv, S_buf, Dh), plus inputs every step reads (a
    seq2seq decoder's encoder keys/values and mask)."""

    def __init__(self, task, batch, length, fixed):
        self.session = onnxruntime.InferenceSession(decode_model(task).SerializeToString())
        _, layers, _, heads, _, head_dim = task.backbone.cache_shape(1, 1)
        self.buffers = [np.zeros((batch, heads, length, head_dim), np.float32) for _ in range(2 * layers)]
        self.names = [f"past_key_values.{i}.{part}" for i in range(layers) for part in ("key", "value")]
        self.fixed = fixed

    def step(self, rows, tokens, positions):
        """tokens, positions (R, T) for buffer rows `rows` (a slice) -> logits (R, T, V)."""
        binding, values = self.session.io_binding(), []
        for buffer, name in zip(self.buffers, self.names):
            values.append(onnxruntime.OrtValue.ortvalue_from_numpy(buffer[rows]))
            binding.bind_ortvalue_input(name, values[-1])
            binding.bind_ortvalue_output(name.replace("past_key_values", "present"), values[-1])
        feeds = {"input_ids": tokens, "position_ids": positions, **{k: v[rows] for k, v in self.fixed.items()}}
        for name, array in feeds.items():
            binding.bind_cpu_input(name, np.ascontiguousarray(array, array.dtype))
        binding.bind_output("logits")
        self.session.run_with_iobinding(binding)
        return binding.copy_outputs_to_cpu()[-1]


def _full_pass(task, ids):
    """Keras's logits of every position (B, S, V), and what a seq2seq decoder step reads besides its tokens."""
    mask = np.ones(ids.shape, bool)
    if not isinstance(task, Seq2SeqLM):
        return helpers.to_numpy(task({"token_ids": ids, "padding_mask": mask})), {}
    source = np.random.default_rng(3).integers(1, task.backbone.vocabulary_size, (ids.shape[0], 9)).astype("int32")
    source_mask = np.arange(9)[None] < np.array([[9], [6], [8]])  # (B, S_enc), ragged sources
    inputs = {"encoder_token_ids": source, "encoder_padding_mask": source_mask}
    logits = task({**inputs, "decoder_token_ids": ids, "decoder_padding_mask": mask})
    cross = helpers.to_numpy(task.compute_cross_cache(task.encode(source, source_mask)))  # (B, L, 2, Hkv, S_enc, Dh)
    fixed = {"encoder_attention_mask": source_mask.astype(np.int64)}
    for i in range(cross.shape[1]):
        for j, part in enumerate(("key", "value")):
            fixed[f"cross_key_values.{i}.{part}"] = np.ascontiguousarray(cross[:, i, j])
    return helpers.to_numpy(logits), fixed


@pytest.mark.parametrize("family", list(BUILDERS))
def test_tokens_after_a_past_match_the_full_forward_pass(family):
    task = BUILDERS[family]()
    batch, length = len(PASTS), max(PASTS) + NEW + 1
    ids = np.random.default_rng(11).integers(1, task.backbone.vocabulary_size, (batch, length)).astype("int32")
    expected, fixed = _full_pass(task, ids)
    rows = _Rows(task, batch, length + 3, fixed)  # buffers longer than any row's length
    if _longrope(task):  # a step of up to 6 positions rotates by other tables than the full pass: Keras's cache
        _, cache = task.call_with_cache(ids, np.zeros(task.backbone.cache_shape(batch, length), "float32"), 0)
        cache = helpers.to_numpy(cache)  # (B, L, 2, Hkv, S, Dh)
        for index, buffer in enumerate(rows.buffers):
            for b, past in enumerate(PASTS):
                buffer[b, :, :past] = cache[b, index // 2, index % 2, :, :past]
    for b, past in enumerate(PASTS if not _longrope(task) else ()):  # each row's past, in steps of up to 4 tokens
        for start in range(0, past, 4):
            span = np.arange(start, min(start + 4, past))[None]  # (1, T), the first from position 0
            logits = rows.step(slice(b, b + 1), ids[b : b + 1, span[0]].astype(np.int64), span)
            np.testing.assert_allclose(logits[0], expected[b, span[0]], atol=ATOL)
    for b, past in enumerate(PASTS):  # NEW tokens after each row's past
        span = np.arange(past, past + NEW)[None]
        logits = rows.step(slice(b, b + 1), ids[b : b + 1, span[0]].astype(np.int64), span)
        np.testing.assert_allclose(logits[0], expected[b, span[0]], atol=ATOL)
    # Then one token per row, the whole batch at once, each at its own position: reads what the steps wrote.
    positions = np.array(PASTS)[:, None] + NEW  # (B, 1)
    logits = rows.step(slice(0, batch), np.take_along_axis(ids, positions, axis=1).astype(np.int64), positions)
    np.testing.assert_allclose(logits[:, 0], expected[np.arange(batch), positions[:, 0]], atol=ATOL)


def _longrope(task):
    """Whether the task's rotary positions switch tables past a length (Phi-3's longrope; here at 6 positions)."""
    if isinstance(task, Seq2SeqLM):
        return False
    rotary = task.backbone.transformer_layers[0].self_attention.rotary_embedding
    return rotary is not None and rotary.long_after is not None


def test_the_token_axis_is_symbolic():
    """input_ids, position_ids and logits have a symbolic token axis (a one-token step is not a special graph)."""
    model = decode_model(helpers.tiny_gpt())
    shapes = {
        value.name: [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]
        for value in [*model.graph.input, *model.graph.output]
    }
    assert shapes["input_ids"] == shapes["position_ids"] == ["batch", "sequence"]
    assert shapes["logits"][:2] == ["batch", "sequence"]
