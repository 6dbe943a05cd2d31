"""The grouped matrix product `keras.ops` lacks, on PyTorch: each expert's run of sorted rows through its own
slice of the stacked weights, read in place, forward and backward (private to `MixtureOfExperts`).

Axes: A assignments (rows, sorted by expert), D model width, E experts, I one expert's width, C rows per expert
in the batched product, H the rows it holds.

PyTorch's compiled training step (models/compiled_step.py) records ATen operations with static shapes, so a
product of data-dependent size cannot be written in `keras.ops` there: the layer's blocks instead gather a copy
of their experts' weights (scatter-added back in the gradient) and compute padding rows. Registered as a
`torch.library` custom operation, the runs are one opaque node of that graph, with its own backward. Its
implementation reads the experts' row counts on the host, then runs every expert's first C rows (C the largest
count, at most floor(2 A / E)) as one batched product per weight whose batch index is the expert (the stacked
weights read in place, one call: each product call costs a thread wake-up), padding shorter runs with zero rows
(at most 2 A rows in all), and the rows of longer runs past C one product per expert. The weights' gradients are
written per expert, never scattered, and an expert no row chose gets an exact zero gradient. No expert runs on
rows it was not chosen for beyond that bounded padding.
"""

import functools

_PADDING_LIMIT = 2  # C <= floor(this x A / E): the padded rows, E C, stay within this x A


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


def _plan(torch, counts, rows):
    """(head, slots, C, overflow): the rows of rank < C in their expert's run (H,) and their places in the padded
    (E C) rows, with C = min(the largest count, floor(2 A / E)); and (expert, rows slice) of the runs past C."""
    sizes = counts.tolist()
    experts = len(sizes)
    capacity = min(max(sizes, default=0), _PADDING_LIMIT * rows // max(experts, 1))
    counts = counts.long()
    owner = torch.repeat_interleave(torch.arange(experts, device=counts.device), counts, output_size=rows)  # (A,)
    starts = counts.cumsum(0) - counts  # (E,): each expert's first row
    rank = torch.arange(rows, device=counts.device) - starts[owner]  # (A,): each row's rank within its expert
    head = torch.nonzero(rank < capacity).squeeze(1)  # (H,)
    overflow, start = [], 0
    for expert, count in enumerate(sizes):
        if count > capacity:
            overflow.append((expert, slice(start + capacity, start + count)))
        start += count
    return head, owner[head] * capacity + rank[head], capacity, overflow


def _pad(rows, slots, experts, capacity):
    """(H, F) rows -> (E, C, F), zeros where an expert has fewer than C rows."""
    padded = rows.new_zeros(experts * capacity, rows.shape[-1]).index_copy_(0, slots, rows)
    return padded.view(experts, capacity, -1)


def _part_forward(act, x, gate, up, down):
    """(out, gate_pre, up_pre) of rows (..., R, D) through weights (..., D, I), (..., I, D): padded experts (a batch)
    or one expert's rows."""
    gate_pre, up_pre = x @ gate, x @ up  # (..., R, I)
    return act(gate_pre) * up_pre @ down, gate_pre, up_pre  # (..., R, I) x (..., I, D) -> (..., R, D)


def _part_backward(act, act_backward, grad, x, gate_pre, up_pre, gate, up, down):
    """(grad_x, grad_gate, grad_up, grad_down) of `_part_forward` given grad (..., R, D)."""
    activated = act(gate_pre)  # (..., R, I)
    grad_h = grad @ down.transpose(-1, -2)  # (..., R, D) x (..., D, I)
    grad_down = (activated * up_pre).transpose(-1, -2) @ grad  # (..., I, R) x (..., R, D)
    grad_up_pre = grad_h * activated
    grad_gate_pre = act_backward(grad_h * up_pre, gate_pre)
    x_t = x.transpose(-1, -2)  # (..., D, R)
    grad_x = grad_gate_pre @ gate.transpose(-1, -2) + grad_up_pre @ up.transpose(-1, -2)  # (..., R, D)
    return grad_x, x_t @ grad_gate_pre, x_t @ grad_up_pre, grad_down


def _forward(torch, x, counts, gate, up, down, activation):
    """(out (A, D), gate_pre (A, I), up_pre (A, I)): the products before the activation, kept for the backward.
    Every expert's first C rows in one batched product per weight (batch index = expert: the stacked weights read
    in place), the rows past C one product per expert."""
    act = _activations(torch)[activation][0]
    head, slots, capacity, overflow = _plan(torch, counts, x.shape[0])
    rows, inner = x.shape[0], gate.shape[-1]
    outputs = (x.new_empty(rows, down.shape[-1]), x.new_empty(rows, inner), x.new_empty(rows, inner))
    if capacity:
        parts = _part_forward(act, _pad(x.index_select(0, head), slots, gate.shape[0], capacity), gate, up, down)
        for whole, part in zip(outputs, parts):  # (E, C, F) -> (H, F) -> the head rows of (A, F)
            whole.index_copy_(0, head, part.flatten(0, 1).index_select(0, slots))
    for expert, run in overflow:
        for whole, part in zip(outputs, _part_forward(act, x[run], gate[expert], up[expert], down[expert])):
            whole[run] = part
    return outputs


def _backward(torch, grad, x, counts, gate, up, down, gate_pre, up_pre, activation):
    """(grad_x (A, D), grad_gate, grad_up (E, D, I), grad_down (E, I, D)) of the runs, given grad (A, D)."""
    act, act_backward = _activations(torch)[activation]
    head, slots, capacity, overflow = _plan(torch, counts, x.shape[0])
    grad_x = torch.empty_like(x)
    grads = [torch.zeros_like(gate), torch.zeros_like(up), torch.zeros_like(down)]
    if capacity:
        padded = (_pad(t.index_select(0, head), slots, gate.shape[0], capacity) for t in (grad, x, gate_pre, up_pre))
        part_x, *grads = _part_backward(act, act_backward, *padded, gate, up, down)
        grad_x.index_copy_(0, head, part_x.flatten(0, 1).index_select(0, slots))  # (E, C, D) -> (H, D)
    for expert, run in overflow:
        weights = (gate[expert], up[expert], down[expert])
        part_x, *parts = _part_backward(act, act_backward, grad[run], x[run], gate_pre[run], up_pre[run], *weights)
        grad_x[run] = part_x
        for whole, part in zip(grads, parts):
            whole[expert] += part
    return (grad_x, *grads)


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
