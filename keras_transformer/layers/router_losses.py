"""The router losses of a mixture of experts in training, and the experts' load.

Axes: B batch, T sequence length, N = B * T tokens, M mixture-of-experts layers, E experts, k experts per token.

Load balancing (Switch Transformer eqs. 4-6, as transformers' `load_balancing_loss_func` computes it for Mixtral,
Qwen3-MoE and OLMoE): over the tokens of every layer at once (the M layers' logits concatenated), f_e is the
share of tokens whose top k hold expert e (the f_e sum to k) and P_e the mean router probability of e, both
weighted by the padding mask; the loss is E * sum_e f_e P_e (k when the routing is uniform). Only P_e carries a
gradient. The router z-loss (ST-MoE, Zoph et al. 2022) is the masked mean over the same tokens of
logsumexp(router logits)^2: it keeps the logits small.
"""

import keras
from keras import ops


def load_balancing_loss(router_logits, top_k, mask=None):
    """The load-balancing loss of M layers' router logits, as transformers' `load_balancing_loss_func`.

    Args:
        router_logits: a list of M (N, E) tensors (float32), one per mixture-of-experts layer.
        top_k: int k, experts per token.
        mask: None, or (B, T) / (N,) with 1 (True) for a real token and 0 for padding.

    Returns:
        A float32 scalar: E * sum_e f_e P_e over the M * N tokens.
    """
    probabilities, chosen, weights = _routing(router_logits, top_k, mask)  # (M N, E), (M N, E), (M N,)
    total = ops.maximum(ops.sum(weights), 1.0)  # a batch of padding only gives 0, not nan
    tokens_per_expert = ops.sum(chosen * weights[:, None], axis=0) / total  # (E,), sums to k
    probability_per_expert = ops.sum(probabilities * weights[:, None], axis=0) / total  # (E,)
    return ops.sum(tokens_per_expert * probability_per_expert) * ops.shape(probabilities)[-1]


def router_z_loss(router_logits, mask=None):
    """The router z-loss: the (masked) mean over M layers' tokens of logsumexp(logits)^2; float32 scalar."""
    logits = ops.concatenate([ops.cast(x, "float32") for x in router_logits], axis=0)  # M x (N, E) -> (M N, E)
    weights = _token_weights(mask, len(router_logits), ops.shape(logits)[0])
    squares = ops.square(ops.logsumexp(logits, axis=-1))  # (M N,)
    return ops.sum(squares * weights) / ops.maximum(ops.sum(weights), 1.0)


def expert_load(router_logits, top_k, mask=None):
    """(M, E) float32: each layer's share of its real tokens' k assignments that went to each expert (each row
    sums to 1; 1 / E everywhere when the routing is balanced)."""
    _, chosen, weights = _routing(router_logits, top_k, mask)
    layers = len(router_logits)
    counts = ops.sum(ops.reshape(chosen * weights[:, None], (layers, -1, ops.shape(chosen)[-1])), axis=1)  # (M, E)
    return counts / ops.maximum(ops.sum(counts, axis=1, keepdims=True), 1.0)


def _routing(router_logits, top_k, mask):
    """(probabilities (M N, E), chosen (M N, E) 0/1 with k ones per row, token weights (M N,)), all float32."""
    logits = ops.concatenate([ops.cast(x, "float32") for x in router_logits], axis=0)  # M x (N, E) -> (M N, E)
    probabilities = ops.softmax(logits, axis=-1)
    _, experts = ops.top_k(ops.stop_gradient(probabilities), top_k)  # (M N, k), as the layer picks them
    chosen = ops.sum(ops.one_hot(experts, ops.shape(logits)[-1], dtype="float32"), axis=1)  # (M N, k, E) -> (M N, E)
    return probabilities, chosen, _token_weights(mask, len(router_logits), ops.shape(logits)[0])


def _token_weights(mask, layers, rows):
    """(M N,) float32: the padding mask flattened and repeated for each layer (ones without a mask)."""
    if mask is None:
        return ops.ones((rows,), "float32")
    return ops.tile(ops.reshape(ops.cast(mask, "float32"), (-1,)), (layers,))  # (B, T) -> (N,) -> (M N,)


@keras.saving.register_keras_serializable(package="keras_transformer")
class RouterLosses(keras.layers.Layer):
    """Adds the router losses of a model's mixture-of-experts layers to its loss in training, and records the
    experts' load; the hidden states pass through unchanged.

    A backbone puts it after its last layer, fed with every mixture-of-experts layer's router logits, so that
    `fit` (every backend, and this project's compiled PyTorch step) adds
    `router_aux_loss_coef * load_balancing_loss + router_z_loss_coef * router_z_loss` to the task's loss
    (`self.add_loss`). Outside training (`evaluate`, `predict`, generation) it computes nothing.

    In each training step it also writes `expert_load`, a non-trainable (M, E) float32 weight: the share of each
    layer's token assignments that went to each expert in that batch (padding left out; 1 / E when balanced, one
    entry near 1 when the router has collapsed). `keras_transformer.models.ExpertLoad`, a callback, reads it
    into `fit`'s logs. Being a weight, it is saved with the others (M * E floats).

    Args:
        num_experts: int E.
        top_k: int k, experts per token.
        num_moe_layers: int M, the number of router logits the layer receives.
        router_aux_loss_coef: float >= 0, the load-balancing loss's coefficient (0: not added).
        router_z_loss_coef: float >= 0, the router z-loss's coefficient (0: not added).

    Call arguments:
        inputs: (B, T, D) hidden states, returned as they are.
        router_logits: a list of M (B * T, E) float32 router logits.
        padding_mask: (B, T) bool or None; padded tokens count in neither loss nor the load.
        training: bool; the losses and the load only when True.

    Returns:
        `inputs`.

    Example:
    >>> layer = RouterLosses(num_experts=4, top_k=2, num_moe_layers=1, router_aux_loss_coef=0.01)
    >>> y = layer(keras.ops.ones((1, 3, 8)), [keras.random.normal((3, 4))], training=True)
    >>> len(layer.losses), tuple(layer.expert_load.shape)
    (1, (1, 4))
    """

    def __init__(self, num_experts, top_k, num_moe_layers, router_aux_loss_coef=0.0, router_z_loss_coef=0.0, **kwargs):
        super().__init__(**kwargs)
        for name, value in (("num_experts", num_experts), ("top_k", top_k), ("num_moe_layers", num_moe_layers)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"`{name}` must be a positive int. Received: {name}={value!r}")
        check_coefficients(router_aux_loss_coef=router_aux_loss_coef, router_z_loss_coef=router_z_loss_coef)
        self.num_experts = num_experts
        self.top_k = top_k
        self.num_moe_layers = num_moe_layers
        self.router_aux_loss_coef = float(router_aux_loss_coef)
        self.router_z_loss_coef = float(router_z_loss_coef)

    def build(self, inputs_shape, router_logits_shape=None, padding_mask_shape=None):
        self.expert_load = self.add_weight(
            (self.num_moe_layers, self.num_experts),
            initializer="zeros",
            trainable=False,
            dtype="float32",
            name="expert_load",
        )
        self.built = True

    def call(self, inputs, router_logits, padding_mask=None, training=None):
        if not training:
            return inputs
        if len(router_logits) != self.num_moe_layers:
            raise ValueError(
                f"Expected the router logits of num_moe_layers={self.num_moe_layers} layers. "
                f"Received: {len(router_logits)}"
            )
        loss = None
        if self.router_aux_loss_coef:
            loss = self.router_aux_loss_coef * load_balancing_loss(router_logits, self.top_k, padding_mask)
        if self.router_z_loss_coef:
            z_loss = self.router_z_loss_coef * router_z_loss(router_logits, padding_mask)
            loss = z_loss if loss is None else loss + z_loss
        if loss is not None:
            self.add_loss(loss)
        self.expert_load.assign(ops.stop_gradient(expert_load(router_logits, self.top_k, padding_mask)))
        return inputs

    def compute_output_spec(self, inputs, router_logits, padding_mask=None, training=None):
        return keras.KerasTensor(inputs.shape, dtype=inputs.dtype)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_experts": self.num_experts,
                "top_k": self.top_k,
                "num_moe_layers": self.num_moe_layers,
                "router_aux_loss_coef": self.router_aux_loss_coef,
                "router_z_loss_coef": self.router_z_loss_coef,
            }
        )
        return config


def check_coefficients(**coefficients):
    """Raise a ValueError naming the first coefficient that is not a float >= 0."""
    for name, value in coefficients.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            raise ValueError(f"`{name}` must be a float >= 0. Received: {name}={value!r}")
