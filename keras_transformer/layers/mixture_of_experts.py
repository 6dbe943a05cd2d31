"""Sparse mixture-of-experts feed-forward: a router picks k of E gated experts per token, and only those run.

Axes: B batch, T sequence length, N = B * T tokens, D model width, E experts, k experts per token,
A = N * k assignments (token, expert), I one expert's intermediate width, P padded assignment rows,
G blocks of P (each of one expert), b rows per block.

How the tokens reach their experts (`_dispatch`, the layer's one backend switch). On PyTorch, by its grouped
product of the experts' runs (`expert_runs`, a custom operation that its one-graph compiled steps record as one
node): the A assignments sorted by expert, each expert's run through its own weights in place, forward and
backward, exactly A rows. Under XLA (JAX, TensorFlow), with static shapes (`keras.ops` has no grouped matrix
product; JAX's `ragged_dot` is one on accelerators, but on the CPU it is lowered to a dense product over every
expert): the A assignments are sorted by expert; each expert's run is padded to a multiple of b rows and cut into
blocks of b rows; each block gathers its one expert's weights and runs a (b, D) x (D, I) product. The number of
blocks is bounded by ceil((A + min(E, A) * (b - 1)) / b), so the work is the active experts' (A rows) plus at most
b - 1 padding rows per expert, never E / k times it. At one token (a batch-1 decoding step) b is 1: the step reads
the k chosen experts' weights and no other. The results are gathered back to the assignments and summed per token
with the router weights. Every move is a gather (no float scatter), so gradients are gathers and scatter-adds on
every backend. With no more assignments than experts (a decoding step of up to E / k rows) no sorting is needed:
each assignment runs its own expert. Outside training a block's (or an assignment's) expert is picked by
`ops.switch` among branches that read the stacked weights in place; in training the blocks gather their weights
(see `experts_output`).
"""

import keras
from keras import ops

from keras_transformer.layers.expert_runs import expert_runs
from keras_transformer.layers.feed_forward import FeedForward

_BLOCKS_PER_EXPERT = 1  # b = A / (this x E): an expert with its mean share of the rows fills this many blocks


@keras.saving.register_keras_serializable(package="keras_transformer")
class MixtureOfExperts(keras.layers.Layer):
    """A sparse mixture of gated (SwiGLU-style) experts, as Mixtral, Qwen-MoE, Qwen3-MoE and OLMoE define it.

    The router is a linear map to E logits; its softmax over the E experts (in float32) gives each token's
    probabilities, of which the top k are kept, renormalised to sum to one when `normalize_top_k` (Mixtral, whose
    softmax over the top-k logits is the same; Qwen3-MoE's `norm_topk_prob`) or left as they are (OLMoE). Each
    token's output is the weighted sum of its k experts' outputs, act(x W_gate) * (x W_up) W_down; no token is
    dropped (no capacity). An optional shared expert (Qwen2-MoE) runs on every token, scaled by
    sigmoid(x w_gate) when `shared_expert_gate`.

    Args:
        num_experts: int E >= 1.
        top_k: int k in [1, E], experts per token.
        intermediate_dim: int I, one expert's inner width.
        activation: the experts' gate activation: "silu" (SwiGLU) or "gelu" / "gelu_approximate" / "relu".
        normalize_top_k: bool, renormalise the k kept probabilities to sum to one.
        shared_intermediate_dim: None, or the inner width of a shared gated expert that every token runs.
        shared_expert_gate: bool, scale the shared expert's output by a learned sigmoid gate (Qwen2-MoE).
        kernel_initializer: initializer of the router, the experts and the shared expert.

    Call arguments:
        inputs: (B, T, D).
        return_router_logits: bool, also return the router's logits (B * T, E), in float32 (for the
            load-balancing loss, `router_losses.load_balancing_loss`).
        training: bool. Under XLA, in training the blocks gather their experts' weights (one batched product,
            whose gradient is a scatter-add); otherwise each block picks its expert with `ops.switch`, which reads
            the stacked weights in place (see `experts_output`). PyTorch runs its grouped product either way.

    Returns:
        (B, T, D); with `return_router_logits`, `(outputs, router_logits)`.

    Example:
    >>> moe = MixtureOfExperts(num_experts=4, top_k=2, intermediate_dim=8)
    >>> keras.ops.shape(moe(keras.random.normal((2, 3, 16))))
    (2, 3, 16)
    """

    def __init__(
        self,
        num_experts,
        top_k,
        intermediate_dim,
        activation="silu",
        normalize_top_k=True,
        shared_intermediate_dim=None,
        shared_expert_gate=False,
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        for name, value in (("num_experts", num_experts), ("top_k", top_k), ("intermediate_dim", intermediate_dim)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"`{name}` must be a positive int. Received: {name}={value!r}")
        if top_k > num_experts:
            raise ValueError(
                f"`top_k` must be at most `num_experts` ({num_experts}): a token picks k of the E experts. "
                f"Received: top_k={top_k}"
            )
        if activation not in _ACTIVATIONS:
            raise ValueError(f"`activation` must be one of {tuple(_ACTIVATIONS)}. Received: activation={activation!r}")
        if shared_intermediate_dim is not None and (
            not isinstance(shared_intermediate_dim, int) or shared_intermediate_dim < 1
        ):
            raise ValueError(
                "`shared_intermediate_dim` must be None or a positive int. "
                f"Received: shared_intermediate_dim={shared_intermediate_dim!r}"
            )
        if shared_expert_gate and shared_intermediate_dim is None:
            raise ValueError(
                "`shared_expert_gate` gates the shared expert: it needs `shared_intermediate_dim`. "
                "Received: shared_expert_gate=True, shared_intermediate_dim=None"
            )
        self.num_experts = num_experts
        self.top_k = top_k
        self.intermediate_dim = intermediate_dim
        self.activation = activation
        self.normalize_top_k = bool(normalize_top_k)
        self.shared_intermediate_dim = shared_intermediate_dim
        self.shared_expert_gate = bool(shared_expert_gate)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self._activation_fn = _ACTIVATIONS[activation]

    def build(self, inputs_shape):
        hidden_dim = inputs_shape[-1]
        experts, inner = self.num_experts, self.intermediate_dim
        self.router = keras.layers.Dense(
            experts, use_bias=False, kernel_initializer=self.kernel_initializer, dtype=self.dtype_policy, name="router"
        )
        self.router.build(inputs_shape)
        # The experts' weights, stacked: (E, D, I), (E, D, I), (E, I, D).
        self.gate_kernel = self.add_weight((experts, hidden_dim, inner), self.kernel_initializer, name="gate_kernel")
        self.up_kernel = self.add_weight((experts, hidden_dim, inner), self.kernel_initializer, name="up_kernel")
        self.down_kernel = self.add_weight((experts, inner, hidden_dim), self.kernel_initializer, name="down_kernel")
        if self.shared_intermediate_dim is not None:
            self.shared_expert = FeedForward(
                self.shared_intermediate_dim,
                activation=_GATED[self.activation],
                use_bias=False,
                kernel_initializer=self.kernel_initializer,
                dtype=self.dtype_policy,
                name="shared_expert",
            )
            self.shared_expert.build(inputs_shape)
            if self.shared_expert_gate:
                self.shared_gate = keras.layers.Dense(
                    1, use_bias=False, kernel_initializer=self.kernel_initializer, dtype=self.dtype_policy,
                    name="shared_gate",
                )  # fmt: skip
                self.shared_gate.build(inputs_shape)
        self.built = True

    def route(self, x):
        """x (N, D) -> (router logits (N, E) float32, the k kept weights (N, k) float32, their experts (N, k))."""
        logits = ops.cast(self.router(x), "float32")  # (N, D) -> (N, E)
        probabilities = ops.softmax(logits, axis=-1)
        weights, experts = ops.top_k(probabilities, self.top_k)  # (N, k), (N, k)
        if self.normalize_top_k:
            weights = weights / ops.sum(weights, axis=-1, keepdims=True)
        return logits, weights, experts

    def call(self, inputs, return_router_logits=False, training=None):
        hidden_dim = ops.shape(inputs)[-1]
        x = ops.reshape(inputs, (-1, hidden_dim))  # (B, T, D) -> (N, D)
        logits, weights, experts = self.route(x)
        y = self.experts_output(x, weights, experts, training=training)  # (N, D)
        if self.shared_intermediate_dim is not None:
            shared = self.shared_expert(x)
            if self.shared_expert_gate:
                shared = ops.sigmoid(self.shared_gate(x)) * shared  # (N, 1) * (N, D)
            y = y + shared
        y = ops.reshape(y, ops.shape(inputs))  # (N, D) -> (B, T, D)
        return (y, logits) if return_router_logits else y

    def experts_output(self, x, weights, experts, training=None):
        """x (N, D), the router's kept weights (N, k) and experts (N, k) -> sum_k w_k expert_k(x) (N, D).

        Only the chosen experts run (see the module's docstring for the blocks). On PyTorch, the grouped product of
        the sorted runs (`_runs_output`). Under XLA outside training each block (or each assignment, when there
        are at most E) runs its expert by `ops.switch` among E branches that read the stacked weights in place:
        XLA's CPU gather of whole (D, I) slices copies them 3-8 times slower than that. In training the blocks
        gather their weights: a batched product whose gradient is one scatter-add (a switch's is a branch per
        block)."""
        num_tokens = ops.shape(x)[0]
        k, num_experts = self.top_k, self.num_experts
        num_assignments = num_tokens * k  # A
        dispatch = _dispatch(training)
        if dispatch == "runs":
            return self._runs_output(x, weights, experts)
        switch = dispatch == "switch"
        if switch and isinstance(num_assignments, int) and num_assignments <= num_experts:
            return self._few_tokens_output(x, weights, experts)
        rows, blocks = expert_blocks(num_assignments, num_experts)  # b, G
        flat_experts = ops.reshape(ops.cast(experts, "int32"), (-1,))  # (N, k) -> (A,), token-major
        order = ops.argsort(flat_experts)  # (A,): the assignments sorted by expert
        sorted_experts = ops.take(flat_experts, order)
        sorted_tokens = ops.cast(order // k, "int32")  # (A,): each sorted assignment's token
        counts = ops.sum(ops.one_hot(flat_experts, num_experts, dtype="int32"), axis=0)  # (E,)
        padded = (counts + rows - 1) // rows * rows  # (E,): each expert's rows, a multiple of b
        starts = ops.cumsum(counts) - counts  # (E,): first sorted assignment of each expert
        padded_ends = ops.cumsum(padded)  # (E,)
        padded_starts = padded_ends - padded
        # The padded row of each sorted assignment: its expert's first row plus its rank within the expert.
        position = ops.arange(num_assignments, dtype="int32")
        destination = ops.take(padded_starts, sorted_experts) + position - ops.take(starts, sorted_experts)  # (A,)
        # Each block's expert: the expert whose padded rows hold the block's first row.
        block_starts = ops.arange(blocks, dtype="int32") * rows  # (G,)
        block_experts = ops.sum(ops.cast(padded_ends[None, :] <= block_starts[:, None], "int32"), axis=1)
        block_experts = ops.minimum(block_experts, num_experts - 1)  # (G,); blocks past the last hold padding only
        # Which sorted assignment fills each padded row: its expert's first assignment plus the row's rank within
        # the expert's rows, unless the rank passes the expert's count (padding). Gathers only, no scatter.
        row_experts = ops.reshape(ops.repeat(block_experts[:, None], rows, axis=1), (-1,))  # (P,)
        rank = ops.arange(blocks * rows, dtype="int32") - ops.take(padded_starts, row_experts)  # (P,)
        filled = rank < ops.take(counts, row_experts)  # (P,)
        source = ops.where(filled, ops.take(starts, row_experts) + rank, 0)  # (P,)
        row_tokens = ops.take(sorted_tokens, source)  # (P,)
        x_rows = ops.where(filled[:, None], ops.take(x, row_tokens, axis=0), 0)  # (P, D), padding rows 0
        x_blocks = ops.reshape(x_rows, (blocks, rows, -1))  # (P, D) -> (G, b, D)
        if not switch:
            gate = ops.take(self.gate_kernel, block_experts, axis=0)  # (E, D, I) -> (G, D, I)
            up = ops.take(self.up_kernel, block_experts, axis=0)
            down = ops.take(self.down_kernel, block_experts, axis=0)  # (G, I, D)
            h = self._activation_fn(ops.matmul(x_blocks, gate)) * ops.matmul(x_blocks, up)  # (G, b, I)
            out_blocks = ops.matmul(h, down)  # (G, b, D)
        else:
            branches = [self._expert(index) for index in range(num_experts)]
            out_blocks = ops.map(lambda block: ops.switch(block[0], branches, block[1]), (block_experts, x_blocks))
        out_rows = ops.reshape(out_blocks, (blocks * rows, -1))  # (G, b, D) -> (P, D)
        out_sorted = ops.take(out_rows, destination, axis=0)  # (A, D), in sorted order
        out = ops.take(out_sorted, ops.argsort(order), axis=0)  # (A, D), token-major again
        out = ops.reshape(out, (num_tokens, k, -1))  # (A, D) -> (N, k, D)
        return ops.sum(out * ops.cast(weights, out.dtype)[:, :, None], axis=1)  # (N, D)

    def _runs_output(self, x, weights, experts):
        """`experts_output` on PyTorch: the assignments sorted by expert, each expert's run of rows through its
        weights in place by the backend's grouped product (`expert_runs`: exactly the A rows, no padding, no
        copy of the weights, whose gradient is written per expert)."""
        num_tokens, k = ops.shape(x)[0], self.top_k
        flat_experts = ops.reshape(ops.cast(experts, "int32"), (-1,))  # (N, k) -> (A,), token-major
        order = ops.argsort(flat_experts)  # (A,): the assignments grouped by expert
        counts = ops.sum(ops.one_hot(flat_experts, self.num_experts, dtype="int32"), axis=0)  # (E,)
        x_sorted = ops.take(x, order // k, axis=0)  # (A, D): each sorted assignment's token
        kernels = (ops.cast(kernel, x.dtype) for kernel in (self.gate_kernel, self.up_kernel, self.down_kernel))
        out_sorted = expert_runs(x_sorted, counts, *kernels, self.activation)  # (A, D)
        out = ops.take(out_sorted, ops.argsort(order), axis=0)  # (A, D), token-major again
        out = ops.reshape(out, (num_tokens, k, -1))  # (A, D) -> (N, k, D)
        return ops.sum(out * ops.cast(weights, out.dtype)[:, :, None], axis=1)  # (N, D)

    def _few_tokens_output(self, x, weights, experts):
        """`experts_output` for A <= E assignments (decoding steps): each assignment runs its expert alone, chosen
        by `ops.switch` among E branches that read their expert's slice of the stacked weights in place (XLA copies
        a gathered (D, I) slice, at a few GB/s on the CPU: a batch-1 step would read its experts twice)."""
        num_tokens, k = ops.shape(x)[0], self.top_k
        flat_experts = ops.reshape(ops.cast(experts, "int32"), (-1,))  # (N, k) -> (A,), token-major
        branches = [self._expert(index) for index in range(self.num_experts)]
        outputs = [
            ops.switch(flat_experts[a], branches, x[a // k : a // k + 1])  # (1, D) -> (1, D)
            for a in range(num_tokens * k)
        ]
        out = ops.reshape(ops.concatenate(outputs, axis=0), (num_tokens, k, -1))  # (A, D) -> (N, k, D)
        return ops.sum(out * ops.cast(weights, out.dtype)[:, :, None], axis=1)  # (N, D)

    def _expert(self, index):
        """Expert `index` as a function of rows (R, D) -> (R, D)."""

        def expert(x):
            h = self._activation_fn(ops.matmul(x, self.gate_kernel[index])) * ops.matmul(x, self.up_kernel[index])
            return ops.matmul(h, self.down_kernel[index])  # (R, I) -> (R, D)

        return expert

    def compute_output_shape(self, inputs_shape):
        return inputs_shape

    def compute_output_spec(self, inputs, return_router_logits=False, training=None):
        outputs = keras.KerasTensor(inputs.shape, dtype=self.compute_dtype)
        if not return_router_logits:
            return outputs
        tokens = None if None in inputs.shape[:-1] else _product(inputs.shape[:-1])
        return outputs, keras.KerasTensor((tokens, self.num_experts), dtype="float32")

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_experts": self.num_experts,
                "top_k": self.top_k,
                "intermediate_dim": self.intermediate_dim,
                "activation": self.activation,
                "normalize_top_k": self.normalize_top_k,
                "shared_intermediate_dim": self.shared_intermediate_dim,
                "shared_expert_gate": self.shared_expert_gate,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            }
        )
        return config


def _dispatch(training):
    """How the tokens reach their experts on this backend (the layer's one backend switch):
    - "runs" on PyTorch: its grouped product, a custom operation (`expert_runs`) that its one-graph compiled
      steps record as one node, running each expert's rows through its weights in place, forward and backward;
    - "switch" under XLA (JAX, TensorFlow) outside training: a branch reads its static slice of the stacked weights
      in place, where a gather copies it slowly;
    - "blocks" under XLA in training: the blocks gather their weights (a switch's gradient is a branch per block)."""
    if keras.config.backend() == "torch":
        return "runs"
    return "blocks" if training else "switch"


def expert_blocks(num_assignments, num_experts):
    """(b, G): rows per block and the number of blocks for A assignments over E experts (ints, or scalar tensors
    where A is only known when the graph runs). b is about A / E, at least 1 (in training the blocks copy their
    experts' weights, which costs more than the padding up to b - 1 rows per expert adds); G bounds the blocks every
    routing can fill: sum over experts of ceil(count / b) <= ceil((A + min(E, A) * (b - 1)) / b)."""
    if isinstance(num_assignments, int):
        rows = max(1, num_assignments // (_BLOCKS_PER_EXPERT * num_experts))
        used = min(num_experts, num_assignments)
        return rows, (num_assignments + used * (rows - 1) + rows - 1) // rows
    rows = ops.maximum(num_assignments // (_BLOCKS_PER_EXPERT * num_experts), 1)
    used = ops.minimum(num_assignments, num_experts)
    return rows, (num_assignments + used * (rows - 1) + rows - 1) // rows


def _product(values):
    result = 1
    for value in values:
        result *= value
    return result


_ACTIVATIONS = {
    "silu": keras.activations.silu,
    "gelu": lambda x: keras.activations.gelu(x, approximate=False),
    "gelu_approximate": lambda x: keras.activations.gelu(x, approximate=True),
    "relu": keras.activations.relu,
}
_GATED = {"silu": "gated-silu", "gelu": "gated-gelu_exact", "gelu_approximate": "gated-gelu", "relu": "gated-relu"}
