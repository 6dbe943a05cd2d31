"""The grouped matrix product `keras.ops` lacks, on PyTorch: each expert's run of sorted rows through its own
slice of the stacked weights, read in place, forward and backward (private to `MixtureOfExperts`).

Axes: A assignments (rows, sorted by expert), D model width, E experts, I one expert's width, C the largest
expert's row count.

PyTorch's compiled training step (models/compiled_step.py) records ATen operations with static shapes, so a
product of data-dependent size cannot be written in `keras.ops` there: the layer's blocks instead gather a copy
of their experts' weights (scatter-added back in the gradient) and compute padding rows. Registered as a
`torch.library` custom operation, the runs are one opaque node of that graph, with its own backward. Its
implementation reads the experts' row counts on the host, then either
- pads every expert's run to C rows and runs one batched product over the E experts, whose batch index is the
  expert (the stacked weights read in place; one call per product), where that adds at most as many padding rows
  as there are assignments (E C <= 2 A: a balanced routing);
- or runs one product per expert on exactly its rows (any routing, however unbalanced).
Either way the weights' gradients are written per expert, never scattered, and an expert no row chose gets an
exact zero gradient. No expert runs on rows it was not chosen for beyond that bounded padding.
"""

import functools

_PADDING_LIMIT = 2  # pad the runs to the largest one while E C <= this x A


def expert_runs(x, counts, gate, up, down, activation):
    """x (A, D) sorted by expert, counts (E,) int, gate and up (E, D, I), down (E, I, D), activation: "silu",
    "gelu", "gelu_approximate" or "relu" -> act(x_e gate_e) * (x_e up_e) down_e for each expert e's run of
    rows, (A, D) in the same order. PyTorch tensors; differentiable in x and the three weights."""
    out, _, _ = _operation()(x, counts, gate, up, down, activation)
    return out


def _activations(torch):
    """{name: (function, (gradient, input) -> the input's gradient)}."""
    F, aten = torch.nn.functional, torch.ops.aten
    return {
        "silu": (F.silu, aten.silu_backward),
        "gelu": (lambda t: F.gelu(t), lambda g, t: aten.gelu_backward(g, t, approximate="none")),
        "gelu_approximate": (
            lambda t: F.gelu(t, approximate="tanh"),
            lambda g, t: aten.gelu_backward(g, t, approximate="tanh"),
        ),
        "relu": (F.relu, lambda g, t: aten.threshold_backward(g, t, 0)),
    }


def _layout(torch, counts, rows):
    """(slots, C): each row's place in the padded (E C) rows, and C; slots None for one product per expert."""
    sizes = counts.tolist()
    capacity = max(sizes) if sizes else 0
    if capacity == 0 or len(sizes) * capacity > _PADDING_LIMIT * rows:
        return None, capacity
    counts = counts.long()
    experts = torch.repeat_interleave(torch.arange(len(sizes), device=counts.device), counts, output_size=rows)
    starts = counts.cumsum(0) - counts  # (E,): each expert's first row
    rank = torch.arange(rows, device=counts.device) - starts[experts]  # (A,): each row's rank within its expert
    return experts * capacity + rank, capacity


def _runs(counts):
    """(expert, rows slice) of each expert with rows."""
    start = 0
    for expert, count in enumerate(counts.tolist()):
        if count:
            yield expert, slice(start, start + count)
        start += count


def _pad(rows, slots, experts, capacity):
    """(A, F) rows -> (E, C, F), zeros where an expert has fewer than C rows."""
    padded = rows.new_zeros(experts * capacity, rows.shape[-1]).index_copy_(0, slots, rows)
    return padded.view(experts, capacity, -1)


def _forward(torch, x, counts, gate, up, down, activation):
    """(out (A, D), gate_pre (A, I), up_pre (A, I)): the products before the activation, kept for the backward."""
    act = _activations(torch)[activation][0]
    slots, capacity = _layout(torch, counts, x.shape[0])
    if slots is not None:  # one batched product per weight, the stacked weights read in place
        x_pad = _pad(x, slots, gate.shape[0], capacity)  # (E, C, D)
        gate_pre, up_pre = torch.bmm(x_pad, gate), torch.bmm(x_pad, up)  # (E, C, I)
        out = torch.bmm(act(gate_pre) * up_pre, down)  # (E, C, I) x (E, I, D) -> (E, C, D)
        return tuple(t.flatten(0, 1).index_select(0, slots) for t in (out, gate_pre, up_pre))
    rows, inner = x.shape[0], gate.shape[-1]
    gate_pre, up_pre, out = x.new_empty(rows, inner), x.new_empty(rows, inner), x.new_empty(rows, down.shape[-1])
    for expert, run in _runs(counts):
        torch.mm(x[run], gate[expert], out=gate_pre[run])  # (count, D) x (D, I)
        torch.mm(x[run], up[expert], out=up_pre[run])
        torch.mm(act(gate_pre[run]) * up_pre[run], down[expert], out=out[run])  # (count, I) x (I, D)
    return out, gate_pre, up_pre


def _backward_padded(torch, grad, x, slots, capacity, gate, up, down, gate_pre, up_pre, activation):
    """`_backward` by batched products over the padded runs (padding rows have zero gradients)."""
    act, act_backward = _activations(torch)[activation]
    experts = gate.shape[0]
    grad, x, gate_pre, up_pre = (_pad(t, slots, experts, capacity) for t in (grad, x, gate_pre, up_pre))
    activated = act(gate_pre)  # (E, C, I)
    grad_h = torch.bmm(grad, down.transpose(1, 2))  # (E, C, D) x (E, D, I) -> (E, C, I)
    grad_down = torch.bmm((activated * up_pre).transpose(1, 2), grad)  # (E, I, C) x (E, C, D) -> (E, I, D)
    grad_up_pre = grad_h * activated
    grad_gate_pre = act_backward(grad_h * up_pre, gate_pre)
    x_t = x.transpose(1, 2)  # (E, D, C)
    grad_gate, grad_up = torch.bmm(x_t, grad_gate_pre), torch.bmm(x_t, grad_up_pre)  # (E, D, I)
    grad_x = torch.bmm(grad_gate_pre, gate.transpose(1, 2)) + torch.bmm(grad_up_pre, up.transpose(1, 2))
    return grad_x.flatten(0, 1).index_select(0, slots), grad_gate, grad_up, grad_down  # (E, C, D) -> (A, D)


def _backward(torch, grad, x, counts, gate, up, down, gate_pre, up_pre, activation):
    """(grad_x (A, D), grad_gate, grad_up (E, D, I), grad_down (E, I, D)) of the runs, given grad (A, D)."""
    slots, capacity = _layout(torch, counts, x.shape[0])
    if slots is not None:
        return _backward_padded(torch, grad, x, slots, capacity, gate, up, down, gate_pre, up_pre, activation)
    act, act_backward = _activations(torch)[activation]
    activated = act(gate_pre)  # (A, I)
    grad_h = torch.empty_like(gate_pre)  # (A, I)
    grad_gate, grad_up, grad_down = torch.zeros_like(gate), torch.zeros_like(up), torch.zeros_like(down)
    for expert, run in _runs(counts):
        torch.mm(grad[run], down[expert].T, out=grad_h[run])  # (count, D) x (D, I)
        torch.mm((activated[run] * up_pre[run]).T, grad[run], out=grad_down[expert])  # (I, count) x (count, D)
    grad_up_pre = grad_h * activated  # (A, I)
    grad_gate_pre = act_backward(grad_h * up_pre, gate_pre)  # (A, I)
    grad_x = torch.empty_like(x)  # (A, D)
    for expert, run in _runs(counts):
        torch.mm(x[run].T, grad_gate_pre[run], out=grad_gate[expert])  # (D, count) x (count, I)
        torch.mm(x[run].T, grad_up_pre[run], out=grad_up[expert])
        torch.mm(grad_gate_pre[run], gate[expert].T, out=grad_x[run])  # (count, I) x (I, D)
        grad_x[run] += grad_up_pre[run] @ up[expert].T
    return grad_x, grad_gate, grad_up, grad_down


@functools.cache
def _operation():
    """The registered forward operation (with its backward), made at the first call: torch is an optional
    dependency, imported only where the layer runs on PyTorch."""
    import torch
    from torch import Tensor

    @torch.library.custom_op("keras_transformer::expert_runs", mutates_args=())
    def forward(
        x: Tensor, counts: Tensor, gate: Tensor, up: Tensor, down: Tensor, activation: str
    ) -> tuple[Tensor, Tensor, Tensor]:
        return _forward(torch, x, counts, gate, up, down, activation)

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
        return _backward(torch, grad, x, counts, gate, up, down, gate_pre, up_pre, activation)

    @backward.register_fake
    def _(grad, x, counts, gate, up, down, gate_pre, up_pre, activation):
        return torch.empty_like(x), torch.empty_like(gate), torch.empty_like(up), torch.empty_like(down)

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs[:5], *output[1:])  # x, counts, gate, up, down, gate_pre, up_pre
        ctx.activation = inputs[5]

    def gradient(ctx, grad, _grad_gate_pre, _grad_up_pre):
        grad_x, grad_gate, grad_up, grad_down = backward(grad.contiguous(), *ctx.saved_tensors, ctx.activation)
        return grad_x, None, grad_gate, grad_up, grad_down, None

    forward.register_autograd(gradient, setup_context=setup_context)
    return forward
