"""Training a mixture of experts with `fit`: the router losses (transformers' load-balancing loss, the ST-MoE
z-loss) in the loss on every backend and in the compiled PyTorch step, the experts' load in `fit`'s logs, and
what `quantize` and `enable_lora` do with the stacked experts."""

import logging

import keras
import numpy as np
import pytest

import keras_transformer as kt
from keras_transformer.layers.router_losses import RouterLosses, load_balancing_loss
from tests.conftest import to_numpy

VOCAB, EXPERTS, TOP_K = 32, 4, 2
MOE = dict(num_experts=EXPERTS, top_k=TOP_K, intermediate_dim=8)


def _backbone(seed=0, **overrides):
    keras.utils.set_random_seed(seed)
    config = dict(
        vocabulary_size=VOCAB,
        num_layers=2,
        num_heads=2,
        hidden_dim=16,
        intermediate_dim=8,
        num_key_value_heads=1,
        rope_max_wavelength=1e6,
        norm_epsilon=1e-5,
        mixture_of_experts=MOE,
    )
    return kt.models.LlamaBackbone(**{**config, **overrides})


def _batch(rows=2, length=7, seed=0):
    """Token ids (rows, length) and a padding mask whose rows after the first end in padding."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, VOCAB, (rows, length)).astype("int32")
    mask = np.ones((rows, length), bool)
    for row in range(1, rows):
        mask[row, length - 1 - row % (length - 2) :] = False  # right padding, 1 to length - 3 tokens
    return ids, mask


def _hf_mixtral():
    """A random tiny transformers Mixtral with our backbone's shape, and our backbone with its weights."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.MixtralConfig(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=8, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, num_local_experts=EXPERTS, num_experts_per_tok=TOP_K, max_position_embeddings=64,
        output_router_logits=True, router_aux_loss_coef=0.02, tie_word_embeddings=True,
    )  # fmt: skip
    hf = transformers.MixtralForCausalLM(config).eval()
    weights = {name: tensor.detach().numpy() for name, tensor in hf.model.state_dict().items()}
    backbone = _backbone(router_aux_loss_coef=config.router_aux_loss_coef, rope_max_wavelength=1e6)
    backbone.token_embedding.embeddings.assign(weights["embed_tokens.weight"])
    backbone.layer_norm.scale.assign(weights["norm.weight"])
    for i, block in enumerate(backbone.transformer_layers):
        p, attention, moe = f"layers.{i}.", block.self_attention, block.feed_forward
        for name, dense in (("q", attention.query_dense), ("k", attention.key_dense), ("v", attention.value_dense)):
            dense.kernel.assign(weights[p + f"self_attn.{name}_proj.weight"].T.reshape(dense.kernel.shape))
        out = attention.output_dense
        out.kernel.assign(weights[p + "self_attn.o_proj.weight"].T.reshape(out.kernel.shape))
        block.self_attention_norm.scale.assign(weights[p + "input_layernorm.weight"])
        block.feed_forward_norm.scale.assign(weights[p + "post_attention_layernorm.weight"])
        moe.router.kernel.assign(weights[p + "mlp.gate.weight"].T)  # (E, D) -> (D, E)
        gate, up = np.split(weights[p + "mlp.experts.gate_up_proj"], 2, axis=1)  # (E, 2I, D) -> 2 x (E, I, D)
        moe.gate_kernel.assign(gate.transpose(0, 2, 1))  # -> (E, D, I)
        moe.up_kernel.assign(up.transpose(0, 2, 1))
        moe.down_kernel.assign(weights[p + "mlp.experts.down_proj"].transpose(0, 2, 1))  # (E, D, I) -> (E, I, D)
    return hf, backbone


def test_router_losses_match_transformers():
    """Our load-balancing loss equals MixtralForCausalLM's `aux_loss` on a padded batch (same weights), and the
    z-loss the ST-MoE formula on transformers' router logits; outside training, no loss."""
    import torch

    hf, backbone = _hf_mixtral()
    ids, mask = _batch(rows=3, length=7)
    with torch.no_grad():
        out = hf(input_ids=torch.tensor(ids, dtype=torch.long), attention_mask=torch.tensor(mask, dtype=torch.long))
    inputs = {"token_ids": ids, "padding_mask": mask}
    hidden = backbone(inputs, training=True)
    (loss,) = backbone.losses
    aux = float(to_numpy(loss)) / backbone.router_aux_loss_coef
    assert abs(aux - float(out.aux_loss)) < 1e-5, (aux, float(out.aux_loss))
    # The same loss from the functions, fed transformers' own router logits.
    hf_logits = [t.numpy() for t in out.router_logits]
    assert abs(float(to_numpy(load_balancing_loss(hf_logits, TOP_K, mask))) - float(out.aux_loss)) < 1e-5

    z_backbone = _backbone(router_z_loss_coef=0.5)
    z_backbone.set_weights(backbone.get_weights())
    z_backbone(inputs, training=True)
    logits, weights = np.concatenate(hf_logits), np.tile(mask.reshape(-1), 2).astype("float64")
    log_z = np.log(np.sum(np.exp(logits.astype("float64")), axis=-1))
    expected = 0.5 * np.sum(weights * log_z**2) / np.sum(weights)
    np.testing.assert_allclose(float(to_numpy(z_backbone.losses[0])), expected, rtol=1e-5)

    assert backbone(inputs).shape == hidden.shape and not backbone.losses  # inference: hidden states only
    np.testing.assert_allclose(to_numpy(backbone(inputs)), to_numpy(hidden), atol=1e-6)


def _task(seed=0, **overrides):
    lm = kt.models.LlamaCausalLM(_backbone(seed, **overrides), None)
    return lm


def _toy_data(rows=32, length=8):
    """Each row counts up from a random start (mod VOCAB): every token is used, so the routing can balance."""
    rng = np.random.default_rng(1)
    ids = ((rng.integers(0, VOCAB, (rows, 1)) + np.arange(length)) % VOCAB).astype("int32")
    x = {"token_ids": ids, "padding_mask": np.ones_like(ids, bool)}
    return x, np.roll(ids, -1, axis=1), np.ones(ids.shape, "float32")


def test_fit_lowers_the_loss_and_uses_every_expert():
    lm = _task(router_aux_loss_coef=0.05, router_z_loss_coef=1e-3)
    lm.compile(optimizer=keras.optimizers.Adam(1e-2))
    x, y, w = _toy_data()
    load = kt.models.ExpertLoad()
    history = lm.fit(x, y, sample_weight=w, batch_size=8, epochs=4, shuffle=False, verbose=0, callbacks=[load])
    losses = history.history["loss"]
    assert losses[-1] < losses[0] - 0.3, losses
    assert len(load.epoch_loads) == 4 and load.epoch_loads[-1].shape == (2, EXPERTS)
    np.testing.assert_allclose(load.epoch_loads[-1].sum(axis=1), 1.0, rtol=1e-5)  # shares of the assignments
    assert load.epoch_loads[-1].min() > 0.25 / EXPERTS, load.epoch_loads[-1]  # every expert in every layer used
    assert history.history["expert_load_min"][-1] == pytest.approx(float(load.epoch_loads[-1].min()))
    assert history.history["expert_load_max"][-1] == pytest.approx(float(load.epoch_loads[-1].max()))


def test_expert_load_needs_a_mixture_of_experts():
    lm = kt.models.LlamaCausalLM(_backbone(mixture_of_experts=None), None)
    lm.compile(optimizer="sgd")
    x, y, _ = _toy_data(rows=2)
    with pytest.raises(ValueError, match="mixture of experts"):
        lm.fit(x, y, epochs=1, verbose=0, callbacks=[kt.models.ExpertLoad()])


def test_the_training_step_adds_the_router_losses(monkeypatch):
    """The loss `fit` reports is the task's plus the router losses, through each backend's compiled step (on
    PyTorch this project's one-graph step, compiled from the first step): a step that dropped them reports
    the task's loss alone, about 2 * 100 lower here."""
    monkeypatch.setenv("KERAS_TRANSFORMER_TORCH_COMPILE_BACKEND", "aot_eager")  # the traced graph, not inductor
    coefficient = 100.0
    lm = _task(router_aux_loss_coef=coefficient)
    lm.compile(optimizer=keras.optimizers.Adam(0.0), jit_compile=True)  # learning rate 0: the weights stay
    x, y, w = _toy_data(rows=4)
    w[1, 5:] = 0.0  # a padded row: the task's loss weights it out, the router losses use the padding mask
    x["padding_mask"][1, 5:] = False
    task_loss = float(to_numpy(lm.compute_loss(x=x, y=y, y_pred=lm(x), sample_weight=w, training=False)))
    lm.backbone(x, training=True)
    router_loss = float(to_numpy(lm.backbone.losses[0]))
    assert router_loss > coefficient  # the load-balancing loss is at least 1 (k = 2 when balanced)
    loss = lm.fit(x, y, sample_weight=w, batch_size=4, epochs=1, verbose=0).history["loss"][0]
    assert loss == pytest.approx(task_loss + router_loss, rel=1e-4)
    if keras.config.backend() == "torch":
        assert lm.train_function.compiled_steps == 1 and lm.train_function.eager_steps == 0
        lm.predict(x, batch_size=4, verbose=0)  # the inference path compiles as one graph too
        assert lm.predict_function.compiled_steps == 1 and lm.predict_function.eager_steps == 0


def test_config_round_trip_and_bad_coefficients():
    backbone = _backbone(router_aux_loss_coef=0.02, router_z_loss_coef=0.001, moe_layers=[False, True])
    config = backbone.get_config()
    assert config["router_aux_loss_coef"] == 0.02 and config["router_z_loss_coef"] == 0.001
    rebuilt = kt.models.LlamaBackbone.from_config(config)
    assert rebuilt.get_config() == config and rebuilt.router_losses.num_moe_layers == 1
    layer = RouterLosses(num_experts=4, top_k=2, num_moe_layers=3, router_z_loss_coef=0.5)
    assert RouterLosses.from_config(layer.get_config()).get_config() == layer.get_config()
    with pytest.raises(ValueError, match="router_aux_loss_coef"):
        _backbone(router_aux_loss_coef=-1.0)
    with pytest.raises(ValueError, match="router_z_loss_coef"):
        _backbone(mixture_of_experts=None, router_z_loss_coef=0.1)
    assert _backbone(mixture_of_experts=None).router_losses is None  # a dense model is unchanged


def test_quantize_leaves_the_experts_float_and_says_so(caplog):
    """...and generation works after it, without running the router losses (the load stays as it was)."""
    lm = _task(router_aux_loss_coef=0.1)
    load = to_numpy(lm.backbone.router_losses.expert_load)
    prompt = np.array([[1, 2, 3, 4]], "int32")
    with caplog.at_level(logging.WARNING, logger="keras_transformer"):
        lm.quantize("int8")
    assert any("stacked experts" in r.getMessage() and "float" in r.getMessage() for r in caplog.records)
    block = lm.backbone.transformer_layers[0]
    assert block.self_attention.query_dense.quantization_mode == "int8"  # attention as in dense families
    assert block.feed_forward.router.quantization_mode is None and block.feed_forward.gate_kernel.dtype == "float32"
    tokens = np.asarray(lm.generate(prompt, max_new_tokens=3, stop_token_ids=None))
    assert tokens.shape == (1, 7) and tokens[0, :4].tolist() == [1, 2, 3, 4]
    np.testing.assert_array_equal(to_numpy(lm.backbone.router_losses.expert_load), load)


def test_lora_leaves_the_experts_frozen_and_says_so(caplog):
    backbone = _backbone()
    with caplog.at_level(logging.WARNING, logger="keras_transformer"):
        backbone.enable_lora(2, target_names=["query", "value", "router"])
    assert any("no LoRA" in r.getMessage() for r in caplog.records)
    trainable = {v.path for v in backbone.trainable_weights}
    assert any("router/lora_kernel_a" in path for path in trainable)
    assert not any("experts" in path or path.endswith("_kernel") and "feed_forward" in path for path in trainable)
