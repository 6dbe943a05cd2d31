"""Plain-PyTorch kernel of `MixtureOfExperts` (the kernel table's "mixture_of_experts"), for a cached decoding step.

Axes: R decoded rows, T new tokens, N = R T tokens, D model width, E experts, k experts per token, A = N k
assignments, I one expert's width, P padded rows, in K blocks of b rows.
"""

import torch
import torch.nn.functional as F

from keras_transformer.kernels.torch_weights import ACTIVATIONS, DTYPES, linear, projection, quantization, weight
from keras_transformer.layers.mixture_of_experts import expert_blocks

__all__ = ["mixture_of_experts"]


def mixture_of_experts(kernels, layer, x, return_router_logits=False, training=None):
    """`MixtureOfExperts.call` at inference: the same routing (the router's softmax over the E experts in float32,
    the top k, renormalised with `normalize_top_k`), and only the chosen experts run (see `_expert_outputs`)."""
    arranged = kernels.weights(layer, _arrange_mixture_of_experts)
    if arranged is None or training or return_router_logits:
        return NotImplemented
    router, gate_up, down, activation, top_k, normalize, shared_expert, shared_gate = arranged
    shape = x.shape
    x = x.reshape(-1, shape[-1])  # (R, T, D) -> (N, D)
    probabilities = torch.softmax(linear(x, *router).float(), dim=-1)  # (N, E), float32 whatever the compute dtype
    weights, experts = probabilities.topk(top_k, dim=-1)  # (N, k), (N, k)
    if normalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    out = _expert_outputs(kernels, x, experts, gate_up, down, activation)  # (N, k, D)
    y = (out * weights.to(out.dtype)[:, :, None]).sum(dim=1)  # (N, D)
    if shared_expert is not None:
        shared = kernels(shared_expert, x)
        y = y + (shared if shared_gate is None else torch.sigmoid(linear(x, *shared_gate)) * shared)  # (N, 1) * (N, D)
    return y.reshape(shape)  # (N, D) -> (R, T, D)


def _arrange_mixture_of_experts(layer):
    """(the router's projection, the experts' gate and up kernels side by side (E, D, 2I), their down kernels
    (E, I, D), the activation, k, `normalize_top_k`, the shared expert or None, its gate's projection or None);
    None (Keras runs the layer) where the experts' own weights are not plain float ones: the kernels quantize
    and adapt only what `projection` reads (the router, the shared expert), never the stacked experts."""
    if quantization(layer) is not None or getattr(layer, "lora_enabled", False) or layer.activation not in ACTIVATIONS:
        return None
    stacked = (layer.gate_kernel, layer.up_kernel, layer.down_kernel)
    if any(variable.dtype not in DTYPES for variable in stacked):
        return None
    gate, up, down = (weight(layer, variable) for variable in stacked)
    width = gate.shape[1]
    shared = layer.shared_intermediate_dim is not None
    return (
        projection(layer.router, width),
        torch.cat([gate, up], dim=-1).contiguous(),  # 2 x (E, D, I) -> (E, D, 2I): one product for both
        down.contiguous(),
        ACTIVATIONS[layer.activation],
        layer.top_k,
        layer.normalize_top_k,
        layer.shared_expert if shared else None,
        projection(layer.shared_gate, width) if shared and layer.shared_expert_gate else None,
    )


def _expert_outputs(kernels, x, experts, gate_up, down, activation):
    """x (N, D), each token's k experts (N, k) -> each assignment's expert output (N, k, D), computed for the A
    assignments only, never for every expert:
    - A <= E (a decoding step's few tokens): each assignment gathers its expert's weights (a batch-1 step reads k
      experts), then one batched product;
    - more, eager: the assignments sorted by expert, each expert's run through its own weights in place (their
      counts read from the device once);
    - more, in a compiled step (static shapes, no host read): sorted, then blocks of b rows of one expert each,
      as `MixtureOfExperts.experts_output` (`_expert_blocks`)."""
    num_tokens, k = experts.shape
    num_experts, width, inner = gate_up.shape[0], gate_up.shape[1], down.shape[1]
    flat = experts.reshape(-1)  # (N, k) -> (A,), token-major
    if flat.shape[0] <= num_experts:
        h = x[:, None, None, :] @ gate_up.index_select(0, flat).view(num_tokens, k, width, 2 * inner)
        h = activation(h[..., :inner]) * h[..., inner:]  # (N, 1, 1, D) x (N, k, D, 2I) -> (N, k, 1, I)
        return (h @ down.index_select(0, flat).view(num_tokens, k, inner, width)).squeeze(2)  # -> (N, k, D)
    order = flat.argsort(stable=True)  # (A,): the assignments grouped by expert
    x_sorted = x.index_select(0, order // k)  # (A, D): each sorted assignment's token
    if kernels.static:
        out_sorted = _expert_blocks(x_sorted, flat, order, gate_up, down, activation)
    else:
        outputs, start = [], 0
        for expert, count in enumerate(torch.bincount(flat, minlength=num_experts).tolist()):
            if count:
                h = x_sorted[start : start + count] @ gate_up[expert]  # (count, D) x (D, 2I)
                outputs.append((activation(h[:, :inner]) * h[:, inner:]) @ down[expert])  # -> (count, D)
                start += count
        out_sorted = torch.cat(outputs)  # (A, D)
    out = torch.empty_like(out_sorted).index_copy_(0, order, out_sorted)  # sorted -> token-major
    return out.view(num_tokens, k, -1)  # (A, D) -> (N, k, D)


def _expert_blocks(x_sorted, flat, order, gate_up, down, activation):
    """The sorted assignments' outputs (A, D) with static shapes: each expert's run padded to a multiple of b rows,
    cut into K blocks of b rows, each block through its one expert's gathered weights (b and K from A and E alone,
    `expert_blocks`, the Keras layer's rule: the padding costs at most b - 1 rows per expert)."""
    num_assignments, width = x_sorted.shape
    num_experts, inner = gate_up.shape[0], down.shape[1]
    rows, blocks = expert_blocks(num_assignments, num_experts)  # b, K
    device = x_sorted.device
    sorted_experts = flat[order]  # (A,)
    counts = F.one_hot(flat, num_experts).sum(dim=0)  # (E,)
    padded = (counts + rows - 1) // rows * rows  # (E,): each expert's rows, a multiple of b
    starts = counts.cumsum(0) - counts  # (E,): each expert's first sorted assignment
    padded_ends = padded.cumsum(0)
    padded_starts = padded_ends - padded
    # Each sorted assignment's padded row: its expert's first row plus its rank within the expert.
    positions = torch.arange(num_assignments, device=device)
    destination = padded_starts[sorted_experts] + positions - starts[sorted_experts]  # (A,)
    x_rows = x_sorted.new_zeros((blocks * rows, width)).index_copy(0, destination, x_sorted)  # (P, D)
    block_starts = torch.arange(blocks, device=device) * rows  # (K,)
    block_experts = (padded_ends[None, :] <= block_starts[:, None]).sum(dim=1).clamp(max=num_experts - 1)  # (K,)
    h = x_rows.view(blocks, rows, width) @ gate_up.index_select(0, block_experts)  # (K, b, D) x (K, D, 2I)
    out_rows = (activation(h[..., :inner]) * h[..., inner:]) @ down.index_select(0, block_experts)  # -> (K, b, D)
    return out_rows.view(blocks * rows, width).index_select(0, destination)  # (P, D) -> (A, D), sorted
