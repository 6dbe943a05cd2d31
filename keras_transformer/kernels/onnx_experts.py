"""ONNX kernel of `MixtureOfExperts` (the kernel table's "mixture_of_experts"): the router, the top k, and only the
chosen experts' products, for the decode and prefill graphs.

Axes: N = B T tokens, D model width, E experts, k experts per token, A = N k assignments, I one expert's width,
P padded rows, in K blocks of b rows.
"""

import logging

import numpy as np

from keras_transformer.kernels.onnx_values import Unsupported, Value, activation, matmul, weight

__all__ = ["mixture_of_experts"]

_log = logging.getLogger("keras_transformer")


def mixture_of_experts(kernels, layer, x, return_router_logits=False, training=None):
    """`MixtureOfExperts.call` at inference, (B, T, D) -> (B, T, D): the same routing (the router's softmax over the
    E experts, the top k, renormalised with `normalize_top_k`), and only the chosen experts run, their stacked
    weights (E, D, I) gathered per assignment: in a decode step each token's k experts (a batch-1 step reads k
    experts' weights, not E), in a prefill by blocks of one expert each (`_expert_blocks`).

    The experts stay float32 in a quantized graph (the router and the shared expert are quantized as every MatMul),
    as a log line says once per graph.
    Axes: N = B T tokens, E experts, k experts per token, A = N k assignments, I one expert's width."""
    if training or return_router_logits:
        raise Unsupported(f"a mixture of experts in training or returning its router's logits ({layer.name})")
    if layer.activation not in ("silu", "gelu", "gelu_approximate", "relu"):
        raise Unsupported(f"no ONNX kernel for the experts' activation {layer.activation!r} ({layer.name})")
    b = kernels.builder
    if b.quantize is not None:
        kernels.memo(("float experts",), lambda: _log.warning(_FLOAT_EXPERTS, b.quantize))
    k, width = layer.top_k, layer.router.kernel.shape[0]
    shape = b.node("Shape", [x.materialize()])
    tokens = Value(b, b.node("Reshape", [x.materialize(), b.const("tokens", np.array([-1, width]))]))  # -> (N, D)
    logits = matmul(kernels, layer.router, tokens).materialize()  # (N, E)
    probabilities = b.node("Softmax", [logits], axis=-1)
    weights, experts = b.node("TopK", [probabilities, b.const("k", np.array([k]))], outputs=2, axis=-1)  # (N, k) x 2
    if layer.normalize_top_k:
        weights = b.node("Div", [weights, b.node("ReduceSum", [weights, b.const("axis_-1", np.array([-1]))])])
    gate_up = np.concatenate([weight(layer.gate_kernel), weight(layer.up_kernel)], axis=-1)  # -> (E, D, 2I)
    gate_up, down = b.const(f"{layer.name}.gate_up", gate_up), b.const(f"{layer.name}.down", weight(layer.down_kernel))
    inner = layer.intermediate_dim
    expert = _expert_blocks if kernels.prefill else _expert_per_assignment
    out = expert(kernels, layer, tokens.name, experts, gate_up, down, inner)  # (N, k, D)
    weighted = b.node("Mul", [out, b.node("Unsqueeze", [weights, b.const("axis_2", np.array([2]))])])
    y = b.node("ReduceSum", [weighted, b.const("axis_1", np.array([1]))], keepdims=0)  # (N, k, D) -> (N, D)
    if layer.shared_intermediate_dim is not None:
        shared = kernels(layer.shared_expert, tokens).materialize()  # (N, D)
        if layer.shared_expert_gate:
            gate = b.node("Sigmoid", [matmul(kernels, layer.shared_gate, tokens).materialize()])  # (N, 1)
            shared = b.node("Mul", [gate, shared])
        y = b.node("Add", [y, shared])
    return Value(b, b.node("Reshape", [y, shape]))  # (N, D) -> (B, T, D)


_FLOAT_EXPERTS = (
    "keras_transformer: the mixture of experts' stacked experts are stored in float32; quantize=%r quantizes the "
    "router, attention and the other projections"
)


def _expert_per_assignment(kernels, layer, x, experts, gate_up, down, inner):
    """x (N, D), experts (N, k) -> (N, k, D): each assignment's expert weights gathered, then batched products."""
    b = kernels.builder
    rows = b.node("Unsqueeze", [x, b.const("axes_1_2", np.array([1, 2]))])  # (N, D) -> (N, 1, 1, D)
    h = b.node("MatMul", [rows, b.node("Gather", [gate_up, experts])])  # x (N, k, D, 2I) -> (N, k, 1, 2I)
    h = _swiglu(kernels, layer, h, inner)  # (N, k, 1, I)
    out = b.node("MatMul", [h, b.node("Gather", [down, experts])])  # x (N, k, I, D) -> (N, k, 1, D)
    return b.node("Squeeze", [out, b.const("axis_2", np.array([2]))])  # -> (N, k, D)


def _expert_blocks(kernels, layer, x, experts, gate_up, down, inner):
    """x (N, D), experts (N, k) -> (N, k, D), as `MixtureOfExperts.experts_output` computes it: the assignments
    sorted by expert, each expert's run padded to a multiple of b rows (b = max(1, A // 4E), the layer's
    `expert_blocks`), cut into K <= (A + min(E, A) (b - 1)) / b blocks of b rows, each block through its one
    expert's gathered weights: the A rows plus at most b - 1 padding rows per expert, and K weight copies (about
    5E for a long prompt), not A."""
    from onnx import TensorProto

    b = kernels.builder
    E, k, width = layer.num_experts, layer.top_k, layer.router.kernel.shape[0]

    def const(name, value):
        return b.const(name, np.array(value, np.int64))

    zero, one = const("zero", 0), const("one", 1)
    flat = b.node("Reshape", [experts, const("flat", [-1])])  # (N, k) -> (A,), token-major
    count = b.node("Shape", [flat])  # [A]
    assignments = b.node("Squeeze", [count, const("axis_0", [0])])  # A
    # TopK of the experts' ids, smallest first: the assignments grouped by expert (in any order within an expert).
    order = b.node("TopK", [b.node("Cast", [flat], to=TensorProto.FLOAT), count], outputs=2, largest=0, sorted=1)[
        1
    ]  # (A,)
    sorted_experts = b.node("Gather", [flat, order])
    chosen = b.node("Equal", [b.node("Unsqueeze", [flat, const("axis_1", [1])]), const("experts", np.arange(E))])
    counts = b.node("ReduceSum", [b.node("Cast", [chosen], to=TensorProto.INT64), const("axis_0", [0])], keepdims=0)
    rows = b.node("Max", [b.node("Div", [assignments, const("4E", 4 * E)]), one])  # b
    rows_1 = b.node("Sub", [rows, one])
    padded = b.node("Mul", [b.node("Div", [b.node("Add", [counts, rows_1]), rows]), rows])  # (E,), multiples of b
    starts = b.node("Sub", [b.node("CumSum", [counts, zero]), counts])  # (E,): each expert's first sorted assignment
    padded_ends = b.node("CumSum", [padded, zero])
    padded_starts = b.node("Sub", [padded_ends, padded])
    positions = b.node("Range", [zero, assignments, one])  # (A,)
    # Each sorted assignment's padded row: its expert's first row plus its rank within the expert.
    rank = b.node("Sub", [positions, b.node("Gather", [starts, sorted_experts])])
    destination = b.node("Add", [b.node("Gather", [padded_starts, sorted_experts]), rank])  # (A,)
    used = b.node("Min", [assignments, const("E", E)])
    padding = b.node("Add", [b.node("Mul", [used, rows_1]), rows_1])  # at most b - 1 rows per expert, and rounding up
    blocks = b.node("Div", [b.node("Add", [assignments, padding]), rows])  # K
    padded_rows = b.node("Unsqueeze", [b.node("Mul", [blocks, rows]), const("axis_0", [0])])  # [P]
    source = b.node(
        "ScatterElements", [b.node("ConstantOfShape", [padded_rows], value=_int64_tensor(0)), destination, order]
    )  # (P,): the assignment each padded row holds (a padding row: assignment 0's; its output is never read)
    x_rows = b.node("Gather", [x, b.node("Div", [source, const("k", k)])])  # (P, D)
    block_starts = b.node("Mul", [b.node("Range", [zero, blocks, one]), rows])  # (K,)
    # Each block's expert: the expert whose padded rows hold the block's first row (the count of experts ending
    # before it), the last one for blocks past every expert's rows (padding only).
    ended = b.node("LessOrEqual", [padded_ends, b.node("Unsqueeze", [block_starts, const("axis_1", [1])])])  # (K, E)
    ended = b.node("ReduceSum", [b.node("Cast", [ended], to=TensorProto.INT64), const("axis_1", [1])], keepdims=0)
    block_experts = b.node("Min", [ended, const("last", E - 1)])  # (K,)
    axis_0 = const("axis_0", [0])
    block_shape = b.node(
        "Concat",
        [b.node("Unsqueeze", [blocks, axis_0]), b.node("Unsqueeze", [rows, axis_0]), const("D", [width])],
        axis=0,
    )  # [K, b, D]
    h = b.node("MatMul", [b.node("Reshape", [x_rows, block_shape]), b.node("Gather", [gate_up, block_experts])])
    h = _swiglu(kernels, layer, h, inner)  # (K, b, D) x (K, D, 2I) -> (K, b, I)
    out_rows = b.node("MatMul", [h, b.node("Gather", [down, block_experts])])  # (K, b, I) x (K, I, D) -> (K, b, D)
    out_rows = b.node("Reshape", [out_rows, const("rows", [-1, width])])  # -> (P, D)
    out = b.node("Gather", [out_rows, b.node("ScatterElements", [order, order, destination])])  # (A, D), token-major
    return b.node("Reshape", [out, const("assignments", [-1, k, width])])  # -> (N, k, D)


def _int64_tensor(value):
    from onnx import TensorProto, helper

    return helper.make_tensor("value", TensorProto.INT64, [1], [value])


def _swiglu(kernels, layer, h, inner):
    """act(gate) * up of h (..., 2I), the gate and up products side by side -> (..., I)."""
    b = kernels.builder
    gate, up = b.node("Split", [h, b.const("split", np.array([inner, inner]))], outputs=2, axis=-1)
    return b.node("Mul", [activation(kernels, layer.activation, Value(b, gate)), up])
