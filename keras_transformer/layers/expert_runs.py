"""The grouped matrix product `keras.ops` lacks, on PyTorch: each expert's run of sorted rows through its own
slice of the stacked weights, read in place, forward and backward (private to `MixtureOfExperts`).

Axes: A assignments (rows, sorted by expert), D model width, E experts, I one expert's width.

PyTorch's compiled training step (models/compiled_step.py) records ATen operations with static shapes, so a
product of data-dependent size cannot be written in `keras.ops` there: the layer's blocks instead gather a copy
of their experts' weights (scatter-added back in the gradient) and compute padding rows. Registered as a
`torch.library` custom operation, the runs are one opaque node of that graph, with its own backward: the
implementation reads the experts' row counts on the host and runs one product per expert on exactly its rows, and
the weights' gradients are written per expert, never scattered. No expert runs on rows it was not chosen for.
"""

import functools


def expert_runs(x, counts, gate, up, down, activation):
    """x (A, D) sorted by expert, counts (E,) int, gate and up (E, D, I), down (E, I, D), activation: "silu",
    "gelu", "gelu_approximate" or "relu" -> act(x_e gate_e) * (x_e up_e) down_e for each expert e's run of
    rows, (A, D) in the same order. PyTorch tensors; differentiable in x and the three weights."""
    out, _, _ = _operation()(x, counts, gate, up, down, activation)
    return out


@functools.cache
def _operation():
    """The registered forward operation (with its backward), made at the first call: torch is an optional
    dependency, imported only where the layer runs on PyTorch."""
    import torch
    import torch.nn.functional as F
    from torch import Tensor

    forward_activations = {
        "silu": F.silu,
        "gelu": lambda t: F.gelu(t, approximate="none"),
        "gelu_approximate": lambda t: F.gelu(t, approximate="tanh"),
        "relu": F.relu,
    }
    backward_activations = {  # (gradient, input) -> gradient of the input
        "silu": torch.ops.aten.silu_backward,
        "gelu": lambda g, t: torch.ops.aten.gelu_backward(g, t, approximate="none"),
        "gelu_approximate": lambda g, t: torch.ops.aten.gelu_backward(g, t, approximate="tanh"),
        "relu": lambda g, t: torch.ops.aten.threshold_backward(g, t, 0),
    }

    def runs(counts):
        """(expert, first row, row count) of each expert with rows (one host read of the counts)."""
        start = 0
        for expert, count in enumerate(counts.tolist()):
            if count:
                yield expert, start, count
            start += count

    @torch.library.custom_op("keras_transformer::expert_runs", mutates_args=())
    def forward(
        x: Tensor, counts: Tensor, gate: Tensor, up: Tensor, down: Tensor, activation: str
    ) -> tuple[Tensor, Tensor, Tensor]:
        rows, inner = x.shape[0], gate.shape[-1]
        gate_pre, up_pre = x.new_empty(rows, inner), x.new_empty(rows, inner)  # (A, I): kept for the backward
        out = x.new_empty(rows, down.shape[-1])  # (A, D)
        for expert, start, count in runs(counts):
            x_e = x[start : start + count]  # (count, D)
            torch.mm(x_e, gate[expert], out=gate_pre[start : start + count])  # (count, D) x (D, I)
            torch.mm(x_e, up[expert], out=up_pre[start : start + count])
            h = forward_activations[activation](gate_pre[start : start + count]) * up_pre[start : start + count]
            torch.mm(h, down[expert], out=out[start : start + count])  # (count, I) x (I, D)
        return out, gate_pre, up_pre

    @forward.register_fake
    def _(x, counts, gate, up, down, activation):
        rows, inner = x.shape[0], gate.shape[-1]
        return x.new_empty(rows, down.shape[-1]), x.new_empty(rows, inner), x.new_empty(rows, inner)

    @torch.library.custom_op("keras_transformer::expert_runs_backward", mutates_args=())
    def backward(
        grad: Tensor,
        x: Tensor,
        counts: Tensor,
        gate: Tensor,
        up: Tensor,
        down: Tensor,
        gate_pre: Tensor,
        up_pre: Tensor,
        activation: str,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        act = forward_activations[activation](gate_pre)  # (A, I)
        grad_h = torch.empty_like(gate_pre)  # (A, I)
        grad_gate, grad_up, grad_down = torch.zeros_like(gate), torch.zeros_like(up), torch.zeros_like(down)
        for expert, start, count in runs(counts):
            rows = slice(start, start + count)
            torch.mm(grad[rows], down[expert].T, out=grad_h[rows])  # (count, D) x (D, I)
            torch.mm((act[rows] * up_pre[rows]).T, grad[rows], out=grad_down[expert])  # (I, count) x (count, D)
        grad_up_pre = grad_h * act  # (A, I)
        grad_gate_pre = backward_activations[activation](grad_h * up_pre, gate_pre)  # (A, I)
        grad_x = torch.empty_like(x)  # (A, D)
        for expert, start, count in runs(counts):
            rows = slice(start, start + count)
            x_e = x[rows].T  # (D, count)
            torch.mm(x_e, grad_gate_pre[rows], out=grad_gate[expert])  # (D, count) x (count, I)
            torch.mm(x_e, grad_up_pre[rows], out=grad_up[expert])
            torch.mm(grad_gate_pre[rows], gate[expert].T, out=grad_x[rows])  # (count, I) x (I, D)
            grad_x[rows] += grad_up_pre[rows] @ up[expert].T
        return grad_x, grad_gate, grad_up, grad_down

    @backward.register_fake
    def _(grad, x, counts, gate, up, down, gate_pre, up_pre, activation):
        return torch.empty_like(x), torch.empty_like(gate), torch.empty_like(up), torch.empty_like(down)

    def setup_context(ctx, inputs, output):
        x, counts, gate, up, down, activation = inputs
        _, gate_pre, up_pre = output
        ctx.save_for_backward(x, counts, gate, up, down, gate_pre, up_pre)
        ctx.activation = activation

    def gradient(ctx, grad, _grad_gate_pre, _grad_up_pre):
        grad_x, grad_gate, grad_up, grad_down = backward(grad.contiguous(), *ctx.saved_tensors, ctx.activation)
        return grad_x, None, grad_gate, grad_up, grad_down, None

    forward.register_autograd(gradient, setup_context=setup_context)
    return forward
