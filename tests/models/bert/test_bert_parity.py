"""BertBackbone and BertMaskedLM against Hugging Face `transformers` with the same random weights.

The peer is `transformers.BertModel` / `BertForMaskedLM` (PyTorch, eager attention), built from a
small random config; its weights are copied into ours by the mapping below, which is the whole
HF -> keras_transformer layout for BERT.

Axes: B batch, T sequence length, P masked positions, H heads, Dh head size, D width, V vocabulary.
"""

import keras
import numpy as np
import torch
import transformers

from keras_transformer.models import BertMaskedLM
from tests.conftest import to_numpy

ATOL = 1e-4


def _hf_config(backbone):
    return transformers.BertConfig(
        vocab_size=backbone.vocabulary_size,
        hidden_size=backbone.hidden_dim,
        num_hidden_layers=backbone.num_layers,
        num_attention_heads=backbone.num_heads,
        intermediate_size=backbone.intermediate_dim,
        max_position_embeddings=backbone.max_sequence_length,
        type_vocab_size=backbone.num_segments,
        layer_norm_eps=backbone.norm_epsilon,
        attn_implementation="eager",
    )


def _randomize(hf_model, seed=0):
    """Random values everywhere (zero biases and unit norms could hide a missing term)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in hf_model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator)
            parameter.copy_(1.0 + 0.2 * noise if "LayerNorm.weight" in name else 0.2 * noise)
    return hf_model.eval()


def _load_hf_bert(backbone, state, prefix=""):
    """Copy a Hugging Face BertModel state dict (numpy) into a BertBackbone."""
    H, D = backbone.num_heads, backbone.hidden_dim
    dh = D // H

    def get(name):
        return state[prefix + name]

    def norm(layer, name):
        layer.gamma.assign(get(f"{name}.weight"))
        layer.beta.assign(get(f"{name}.bias"))

    backbone.token_embedding.embeddings.assign(get("embeddings.word_embeddings.weight"))
    backbone.segment_embedding.embeddings.assign(get("embeddings.token_type_embeddings.weight"))
    backbone.position_embedding.embeddings.assign(get("embeddings.position_embeddings.weight"))
    norm(backbone.embeddings_layer_norm, "embeddings.LayerNorm")
    for i, block in enumerate(backbone.transformer_layers):
        p = f"encoder.layer.{i}."
        attention = block.self_attention
        for ours, theirs in (("query_dense", "query"), ("key_dense", "key"), ("value_dense", "value")):
            dense = getattr(attention, ours)
            # torch Linear weight (D_out, D_in) -> (D, H, Dh)
            dense.kernel.assign(get(f"{p}attention.self.{theirs}.weight").T.reshape(D, H, dh))
            dense.bias.assign(get(f"{p}attention.self.{theirs}.bias").reshape(H, dh))  # (D,) -> (H, Dh)
        # (D, D) -> (H, Dh, D)
        attention.output_dense.kernel.assign(get(f"{p}attention.output.dense.weight").T.reshape(H, dh, D))
        attention.output_dense.bias.assign(get(f"{p}attention.output.dense.bias"))
        norm(block.self_attention_norm, f"{p}attention.output.LayerNorm")
        block.feed_forward.intermediate_dense.kernel.assign(get(f"{p}intermediate.dense.weight").T)  # (D, F)
        block.feed_forward.intermediate_dense.bias.assign(get(f"{p}intermediate.dense.bias"))
        block.feed_forward.output_dense.kernel.assign(get(f"{p}output.dense.weight").T)  # (F, D)
        block.feed_forward.output_dense.bias.assign(get(f"{p}output.dense.bias"))
        norm(block.feed_forward_norm, f"{p}output.LayerNorm")
    if prefix + "pooler.dense.weight" in state:
        backbone.pooled_dense.kernel.assign(get("pooler.dense.weight").T)
        backbone.pooled_dense.bias.assign(get("pooler.dense.bias"))


def _state(hf_model):
    return {name: tensor.detach().numpy() for name, tensor in hf_model.state_dict().items()}


def _inputs(rng, vocabulary_size, batch=2, length=16):
    token_ids = rng.integers(0, vocabulary_size, (batch, length)).astype("int32")
    segment_ids = (np.arange(length)[None, :] >= rng.integers(2, length, (batch, 1))).astype("int32")
    lengths = np.array([length, 3])[:batch]
    padding_mask = np.arange(length)[None, :] < lengths[:, None]  # (B, T)
    return {"token_ids": token_ids, "segment_ids": segment_ids, "padding_mask": padding_mask}


def _torch_kwargs(inputs):
    return {
        "input_ids": torch.tensor(inputs["token_ids"], dtype=torch.long),
        "token_type_ids": torch.tensor(inputs["segment_ids"], dtype=torch.long),
        "attention_mask": torch.tensor(inputs["padding_mask"], dtype=torch.long),
    }


def test_backbone_matches_hugging_face_bert_model(tiny_backbone, rng):
    backbone = tiny_backbone(dropout=0.0)
    hf = _randomize(transformers.BertModel(_hf_config(backbone)))
    _load_hf_bert(backbone, _state(hf))
    inputs = _inputs(rng, backbone.vocabulary_size)
    with torch.no_grad():
        expected = hf(**_torch_kwargs(inputs))
    outputs = backbone(inputs)
    sequence = to_numpy(outputs["sequence_output"])
    pooled = to_numpy(outputs["pooled_output"])
    real = inputs["padding_mask"]
    # Padded positions also match: both models attend from them to the real tokens only.
    np.testing.assert_allclose(sequence, expected.last_hidden_state.numpy(), atol=ATOL, rtol=0)
    np.testing.assert_allclose(pooled, expected.pooler_output.numpy(), atol=ATOL, rtol=0)
    # The comparison is not vacuous: the outputs vary and padding changes the real positions.
    assert np.std(sequence[real]) > 0.1
    unpadded = to_numpy(backbone({**inputs, "padding_mask": np.ones_like(real)})["sequence_output"])
    assert np.max(np.abs(unpadded[1, :3] - sequence[1, :3])) > 1e-2


def test_masked_lm_matches_hugging_face_bert_for_masked_lm(tiny_backbone, rng):
    lm = BertMaskedLM(tiny_backbone(dropout=0.0))
    hf = _randomize(transformers.BertForMaskedLM(_hf_config(lm.backbone)))
    state = _state(hf)
    _load_hf_bert(lm.backbone, state, prefix="bert.")
    lm.mlm_dense.kernel.assign(state["cls.predictions.transform.dense.weight"].T)
    lm.mlm_dense.bias.assign(state["cls.predictions.transform.dense.bias"])
    lm.mlm_layer_norm.gamma.assign(state["cls.predictions.transform.LayerNorm.weight"])
    lm.mlm_layer_norm.beta.assign(state["cls.predictions.transform.LayerNorm.bias"])
    lm.mlm_output_bias.bias.assign(state["cls.predictions.bias"])

    inputs = _inputs(rng, lm.backbone.vocabulary_size)
    mask_positions = np.array([[0, 5, 15, 2], [1, 2, 9, 1]], "int32")  # (B, P): unsorted, a repeat, a padded position
    with torch.no_grad():
        all_logits = hf(**_torch_kwargs(inputs)).logits.numpy()  # (B, T, V)
    expected = np.take_along_axis(all_logits, mask_positions[:, :, None], axis=1)  # (B, P, V)
    logits = lm({**inputs, "mask_positions": mask_positions})
    assert logits.shape == (2, 4, lm.backbone.vocabulary_size)
    assert keras.backend.standardize_dtype(logits.dtype) == "float32"
    np.testing.assert_allclose(to_numpy(logits), expected, atol=ATOL, rtol=0)
    assert np.std(expected) > 0.1
