"""T5Backbone and T5Seq2SeqLM against Hugging Face `transformers.T5ForConditionalGeneration`.

The peer is built from a small random `T5Config` (nothing is downloaded), its weights are
randomised and copied into ours by the mapping below (the whole HF -> keras_transformer layout
for T5), and both run on the same ids, with padding in the encoder and in the decoder.

Axes: B batch, S encoder length, T decoder length, H heads, Dh head size (d_kv), D width, V vocabulary.
"""

import numpy as np
import pytest
import torch
import transformers

from keras_transformer.models import T5Backbone, T5Seq2SeqLM
from tests.conftest import to_numpy


V, L, H, D, DH, F = 120, 2, 4, 32, 8, 64
ATOL = 1e-4

CONFIGS = {
    # T5 v1.0: relu, tied embeddings (decoder output rescaled by D**-0.5), default buckets.
    "v1_0_relu_tied": dict(feed_forward_proj="relu", tie_word_embeddings=True),
    # T5 v1.1: gated-gelu, separate lm_head; few buckets and a short max distance so that the
    # logarithmic buckets and the last shared bucket are all used by these short sequences.
    "v1_1_gated_gelu_untied": dict(
        feed_forward_proj="gated-gelu",
        tie_word_embeddings=False,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=12,
    ),
}


def _hf_model(options, seed=0):
    config = transformers.T5Config(
        vocab_size=V,
        d_model=D,
        d_kv=DH,
        d_ff=F,
        num_layers=L,
        num_decoder_layers=L,
        num_heads=H,
        dropout_rate=0.0,
        layer_norm_epsilon=1e-6,
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=1,
        attn_implementation="eager",
        **options,
    )
    model = transformers.T5ForConditionalGeneration(config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # random everywhere: unit norm scales could hide a missing norm
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator)
            parameter.copy_(1.0 + 0.2 * noise if "layer_norm" in name else 0.3 * noise)
        if not _tied(model.config):
            # transformers v5 always ties lm_head to the embedding (only the D**-0.5 rescaling follows
            # `tie_word_embeddings`); give it its own weights, as T5 v1.1 checkpoints have.
            model.lm_head.weight = torch.nn.Parameter(0.3 * torch.randn((V, D), generator=generator))
    return model.eval()


def _tied(hf_config):
    """T5 v1.0 (tied and rescaled) or v1.1 (separate lm_head, no rescaling), in any transformers version."""
    return getattr(hf_config, "scale_decoder_outputs", hf_config.tie_word_embeddings)


def _our_model(hf_config):
    backbone = T5Backbone(
        vocabulary_size=V,
        num_layers=L,
        num_heads=H,
        hidden_dim=D,
        intermediate_dim=F,
        key_dim=DH,
        dropout=0.0,
        activation=hf_config.feed_forward_proj,
        norm_epsilon=hf_config.layer_norm_epsilon,
        relative_attention_num_buckets=hf_config.relative_attention_num_buckets,
        relative_attention_max_distance=hf_config.relative_attention_max_distance,
        tie_embedding_weights=_tied(hf_config),
    )
    return T5Seq2SeqLM(backbone)


def load_hf_t5(task, state):
    """Copy a T5ForConditionalGeneration state dict (numpy arrays) into a T5Seq2SeqLM.

    Returns the set of our variables that were assigned.
    """
    backbone = task.backbone
    assigned = set()

    def assign(variable, value):
        assert tuple(variable.shape) == value.shape, (variable.path, variable.shape, value.shape)
        variable.assign(value)
        assigned.add(variable.path)

    def attention(layer, prefix):
        for ours, theirs in (("query_dense", "q"), ("key_dense", "k"), ("value_dense", "v")):
            # torch Linear weight (H * Dh, D) -> kernel (D, H, Dh)
            assign(getattr(layer, ours).kernel, state[f"{prefix}.{theirs}.weight"].T.reshape(D, H, DH))
        # (D, H * Dh) -> (H, Dh, D)
        assign(layer.output_dense.kernel, state[f"{prefix}.o.weight"].T.reshape(H, DH, D))

    def feed_forward(layer, prefix):
        if f"{prefix}.wi.weight" in state:
            assign(layer.intermediate_dense.kernel, state[f"{prefix}.wi.weight"].T)  # (F, D) -> (D, F)
        else:  # gated: wi_0 goes through the activation, wi_1 is the linear branch
            assign(layer.gate_dense.kernel, state[f"{prefix}.wi_0.weight"].T)
            assign(layer.intermediate_dense.kernel, state[f"{prefix}.wi_1.weight"].T)
        assign(layer.output_dense.kernel, state[f"{prefix}.wo.weight"].T)  # (D, F) -> (F, D)

    def norm(layer, name):
        assign(layer.weights[0], state[name])

    assign(backbone.token_embedding.embeddings, state["shared.weight"])
    for stack, blocks in (("encoder", backbone.encoder_layers), ("decoder", backbone.decoder_layers)):
        bias_name = f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
        assign(getattr(backbone, f"{stack}_relative_position_bias").embeddings, state[bias_name])
        for i, block in enumerate(blocks):
            p = f"{stack}.block.{i}.layer"
            attention(block.self_attention, f"{p}.0.SelfAttention")
            norm(block.self_attention_norm, f"{p}.0.layer_norm.weight")
            ffn = 1
            if stack == "decoder":
                attention(block.cross_attention, f"{p}.1.EncDecAttention")
                norm(block.cross_attention_norm, f"{p}.1.layer_norm.weight")
                ffn = 2
            feed_forward(block.feed_forward, f"{p}.{ffn}.DenseReluDense")
            norm(block.feed_forward_norm, f"{p}.{ffn}.layer_norm.weight")
        norm(getattr(backbone, f"{stack}_layer_norm"), f"{stack}.final_layer_norm.weight")
    if task.lm_head is not None:
        assign(task.lm_head.kernel, state["lm_head.weight"].T)  # (V, D) -> (D, V)
    return assigned


def _inputs(rng):
    """Ids with right padding in both the encoder (B=3, S=13) and the decoder (T=9)."""
    B, S, T = 3, 13, 9
    encoder_lengths = np.array([13, 7, 10])
    decoder_lengths = np.array([9, 4, 6])
    encoder_mask = np.arange(S)[None, :] < encoder_lengths[:, None]
    decoder_mask = np.arange(T)[None, :] < decoder_lengths[:, None]
    encoder_ids = np.where(encoder_mask, rng.integers(2, V, (B, S)), 0).astype("int32")
    decoder_ids = np.where(decoder_mask, rng.integers(2, V, (B, T)), 0).astype("int32")
    decoder_ids[:, 0] = 0  # the decoder start token (= pad), a real position
    return {
        "encoder_token_ids": encoder_ids,
        "encoder_padding_mask": encoder_mask,
        "decoder_token_ids": decoder_ids,
        "decoder_padding_mask": decoder_mask,
    }


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_t5_matches_hugging_face(name, rng):
    hf = _hf_model(CONFIGS[name])
    task = _our_model(hf.config)
    assigned = load_hf_t5(task, {k: v.detach().numpy() for k, v in hf.state_dict().items()})
    assert assigned == {v.path for v in task.weights}, "every weight of ours must come from the peer"
    assert (task.lm_head is None) == CONFIGS[name]["tie_word_embeddings"]

    x = _inputs(rng)
    with torch.no_grad():
        out = hf(
            input_ids=torch.tensor(x["encoder_token_ids"], dtype=torch.long),
            attention_mask=torch.tensor(x["encoder_padding_mask"], dtype=torch.long),
            decoder_input_ids=torch.tensor(x["decoder_token_ids"], dtype=torch.long),
            decoder_attention_mask=torch.tensor(x["decoder_padding_mask"], dtype=torch.long),
        )
    expected_encoder = out.encoder_last_hidden_state.numpy()
    expected_logits = out.logits.numpy()

    encoder_outputs = to_numpy(task.backbone(x)["encoder_sequence_output"])
    logits = to_numpy(task(x))
    encode_only = to_numpy(task.encode(x["encoder_token_ids"], x["encoder_padding_mask"]))
    # Only real positions: what padded positions hold is not part of either model's contract.
    enc, dec = x["encoder_padding_mask"], x["decoder_padding_mask"]
    assert logits.dtype == np.float32 and logits.shape == expected_logits.shape
    np.testing.assert_allclose(encoder_outputs[enc], expected_encoder[enc], atol=ATOL, rtol=0)
    np.testing.assert_allclose(encode_only[enc], expected_encoder[enc], atol=ATOL, rtol=0)
    np.testing.assert_allclose(logits[dec], expected_logits[dec], atol=ATOL, rtol=0)
    # The comparison is meaningful: logits of this size are far from the tolerance.
    assert np.abs(expected_logits[dec]).max() > 1.0


def test_t5_cached_decoding_matches_hugging_face_step_by_step(rng):
    """Our cached steps against the peer's full forward pass (v1.1 config: gated, untied)."""
    hf = _hf_model(CONFIGS["v1_1_gated_gelu_untied"], seed=1)
    task = _our_model(hf.config)
    load_hf_t5(task, {k: v.detach().numpy() for k, v in hf.state_dict().items()})
    x = _inputs(rng)
    x["decoder_padding_mask"] = np.ones_like(x["decoder_padding_mask"])
    with torch.no_grad():
        expected = hf(
            input_ids=torch.tensor(x["encoder_token_ids"], dtype=torch.long),
            attention_mask=torch.tensor(x["encoder_padding_mask"], dtype=torch.long),
            decoder_input_ids=torch.tensor(x["decoder_token_ids"], dtype=torch.long),
        ).logits.numpy()
    B, T = x["decoder_token_ids"].shape
    encoder_outputs = task.encode(x["encoder_token_ids"], x["encoder_padding_mask"])
    cross_cache = task.compute_cross_cache(encoder_outputs)
    cache = np.zeros(task.backbone.cache_shape(B, T), "float32")
    for t in range(T):
        logits, cache = task.call_with_cache(
            x["decoder_token_ids"][:, t : t + 1], cache, t, cross_cache, x["encoder_padding_mask"]
        )
        np.testing.assert_allclose(to_numpy(logits)[:, 0], expected[:, t], atol=ATOL, rtol=0)
