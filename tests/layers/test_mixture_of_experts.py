"""MixtureOfExperts against the numpy reference, its sparsity counted in the backend's own graph, and its config.

Axes: B batch, T sequence length, N tokens, D model width, E experts, k experts per token, I expert width.
"""

import keras
import numpy as np
import pytest

from keras_transformer.layers import MixtureOfExperts, TransformerDecoderBlock
from keras_transformer.layers.mixture_of_experts import expert_blocks
from tests import reference
from tests.conftest import to_numpy
from tests.layers.helpers import assert_close, randomize_weights, save_and_load, wrap_in_model

D, I = 8, 12


def _built(rng, x, **kwargs):
    layer = MixtureOfExperts(kernel_initializer="zeros", **kwargs)
    layer(x)
    randomize_weights(layer, rng, std=0.5)
    return layer


def _weights(layer):
    weights = {
        "router_kernel": to_numpy(layer.router.kernel),
        "gate_kernel": to_numpy(layer.gate_kernel),
        "up_kernel": to_numpy(layer.up_kernel),
        "down_kernel": to_numpy(layer.down_kernel),
    }
    if layer.shared_intermediate_dim is not None:
        shared = layer.shared_expert
        weights["shared_gate_kernel"] = to_numpy(shared.gate_dense.kernel)
        weights["shared_up_kernel"] = to_numpy(shared.intermediate_dense.kernel)
        weights["shared_down_kernel"] = to_numpy(shared.output_dense.kernel)
        if layer.shared_expert_gate:
            weights["shared_expert_gate_kernel"] = to_numpy(layer.shared_gate.kernel)
    return weights


@pytest.mark.parametrize(
    "shape, experts, k, normalize",
    [
        ((1, 1, D), 16, 2, True),  # a batch-1 decoding step: one block per assignment
        ((2, 5, D), 4, 2, True),
        ((2, 5, D), 8, 1, False),  # OLMoE's norm_topk_prob=False, k = 1
        ((3, 40, D), 4, 4, True),  # k = E: every expert, in blocks of several rows
        ((4, 64, D), 16, 2, False),  # blocks of 4 rows, some experts empty or padded
    ],
)
def test_matches_reference(shape, experts, k, normalize, rng):
    x = rng.standard_normal(shape).astype("float32")
    layer = _built(rng, x, num_experts=experts, top_k=k, intermediate_dim=I, normalize_top_k=normalize)
    expected = reference.mixture_of_experts(_weights(layer), x, k, normalize)
    assert_close(layer(x), expected)
    outputs, logits = layer(x, return_router_logits=True)
    assert_close(outputs, expected)
    assert_close(logits, x.reshape(-1, D) @ _weights(layer)["router_kernel"])


@pytest.mark.parametrize("gated", [False, True])
def test_shared_expert(gated, rng):
    x = rng.standard_normal((2, 6, D)).astype("float32")
    layer = _built(
        rng, x, num_experts=4, top_k=2, intermediate_dim=I, shared_intermediate_dim=6, shared_expert_gate=gated
    )
    assert_close(layer(x), reference.mixture_of_experts(_weights(layer), x, 2))


def test_gradients_reach_only_the_chosen_experts(rng):
    """One token with k = 2 of E = 6: the loss's gradient is nonzero on exactly the two chosen experts' weights
    (the unchosen ones are not computed, so their gradient is exactly zero), and matches finite differences."""
    x = rng.standard_normal((1, 1, D)).astype("float32")
    layer = _built(rng, x, num_experts=6, top_k=2, intermediate_dim=I)
    chosen = set(np.argsort(-reference.softmax(x.reshape(1, D) @ _weights(layer)["router_kernel"])[0])[:2])
    gradients = _gradient(layer, x, layer.gate_kernel)
    nonzero = {e for e in range(6) if np.abs(gradients[e]).max() > 0}
    assert nonzero == chosen


def _gradient(layer, x, variable):
    """d sum(layer(x)) / d variable, on the backend in use."""
    backend = keras.config.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        with tf.GradientTape() as tape:
            loss = keras.ops.sum(layer(x))
        return to_numpy(tape.gradient(loss, variable.value))
    if backend == "jax":
        import jax

        index = [v.path for v in layer.trainable_variables].index(variable.path)
        values = [v.value for v in layer.trainable_variables]

        def loss(values):
            return keras.ops.sum(layer.stateless_call(values, [], x)[0])

        return np.asarray(jax.grad(loss)(values)[index])
    import torch

    value = variable.value
    value.grad = None
    keras.ops.sum(layer(x)).backward()
    gradient = value.grad.detach().cpu().numpy()
    value.grad = None
    assert isinstance(value, torch.nn.Parameter)
    return gradient


def _expert_flops(layer, x, training, blocks):
    """Floating-point operations of the matrix products one call runs, counted by the backend in its own graph."""
    backend = keras.config.backend()
    if backend == "jax":
        import jax

        values = [v.value for v in layer.trainable_variables]
        call = jax.make_jaxpr(lambda values, x: layer.stateless_call(values, [], x, training=training)[0])
        return _jaxpr_flops(call(values, x).jaxpr)
    if backend == "torch":
        return _torch_flops(lambda: layer(x, training=training))
    import tensorflow as tf

    function = tf.function(lambda x: layer(x, training=training))
    return _graph_flops(function.get_concrete_function(tf.TensorSpec(x.shape, "float32")).graph, blocks)


def _torch_flops(fn):
    """The same count for PyTorch, of the products that actually ran (the profiler's aten::mm / addmm / bmm calls
    with their shapes), those inside the experts' custom operation (`expert_runs`) included."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        fn()
    flops = 0
    for event in prof.events():
        shapes = event.input_shapes
        if event.name in ("aten::mm", "aten::bmm"):
            a, b = shapes[0], shapes[1]
        elif event.name == "aten::addmm":
            a, b = shapes[1], shapes[2]
        else:
            continue
        flops += 2 * int(np.prod(a)) * b[-1]  # (.., M, K) x (.., K, N): 2 M K N per batch
    return flops


def _jaxpr_flops(jaxpr):
    """Floating-point operations of a jaxpr's matrix products as it runs: every `dot_general`, those of its
    sub-jaxprs (jit, custom derivatives), and of a `cond` (`switch`) the costliest branch, the one that may run."""
    flops = 0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            (contracting, _), _ = eqn.params["dimension_numbers"]
            lhs = eqn.invars[0].aval.shape
            flops += 2 * int(np.prod(eqn.outvars[0].aval.shape)) * int(np.prod([lhs[axis] for axis in contracting]))
        elif eqn.primitive.name == "cond":
            flops += max(_jaxpr_flops(branch.jaxpr) for branch in eqn.params["branches"])
        elif eqn.primitive.name == "scan":  # `ops.map`: the body once per block
            flops += eqn.params["length"] * _jaxpr_flops(eqn.params["jaxpr"].jaxpr)
        else:
            for param in eqn.params.values():
                inner = getattr(param, "jaxpr", param)
                if hasattr(inner, "eqns"):
                    flops += _jaxpr_flops(inner)
    return flops


def _graph_flops(graph, iterations):
    """The same count for a TensorFlow graph: MatMul / BatchMatMul shapes, of a `Case` the costliest branch, and of
    a `While` (`ops.map` over the blocks) its body `iterations` times."""
    flops = 0
    for op in _live_operations(graph):
        if op.type in ("MatMul", "BatchMatMulV2", "BatchMatMulV3"):
            a = tuple(op.inputs[0].shape)
            out = tuple(op.outputs[0].shape)
            assert None not in out, f"a product of unknown shape: {op.name} {out}"
            inner = a[-1] if not op.get_attr("adj_x" if "Batch" in op.type else "transpose_a") else a[-2]
            flops += 2 * int(np.prod(out)) * inner
        elif op.type in ("Case", "StatelessCase"):
            branches = [graph._get_function(f.name).graph for f in op.get_attr("branches")]
            flops += max(_graph_flops(branch, iterations) for branch in branches)
        elif op.type in ("While", "StatelessWhile"):
            flops += iterations * _graph_flops(graph._get_function(op.get_attr("body").name).graph, iterations)
    return flops


def _live_operations(graph):
    """The operations a graph's outputs (and its control outputs: `tf.function` runs every stateful op) depend on."""
    live, stack = set(), [tensor.op for tensor in graph.outputs] + list(graph.control_outputs)
    while stack:
        op = stack.pop()
        if op not in live:
            live.add(op)
            stack.extend(tensor.op for tensor in op.inputs)
            stack.extend(op.control_inputs)
    return live


@pytest.mark.parametrize("training", [False, True])
@pytest.mark.parametrize("tokens", [1, 8, 64])
def test_dispatch_is_sparse(tokens, training, rng):
    """The products a call computes, counted in the backend's graph (JAX's jaxpr dot_generals, PyTorch's
    FlopCounterMode, the TensorFlow graph's MatMul shapes; of a switch, one branch): the chosen experts' (N k rows,
    plus the bounded padding of the blocks; on PyTorch each expert's first C <= floor(2 N k / E) rows padded, and
    the rows past C) and the router's,
    far below every expert on every token. Outside
    training one and eight tokens (16 assignments <= E) take the per-assignment switch, 64 the sorted blocks, each
    block's expert picked by a switch in a loop over the blocks; in training every case gathers the blocks' weights."""
    experts, k, d, inner = 16, 2, 32, 64
    x = rng.standard_normal((1, tokens, d)).astype("float32")
    layer = MixtureOfExperts(experts, k, inner)
    layer(x)
    router = 2 * tokens * d * experts
    per_row = 3 * 2 * d * inner  # gate, up and down products of one row
    rows, blocks = expert_blocks(tokens * k, experts)
    flops = _expert_flops(layer, x, training, blocks)
    expected = router + blocks * rows * per_row
    if keras.config.backend() == "torch":  # the grouped product: the runs padded to the largest, or exact rows
        logits = x.reshape(tokens, d) @ to_numpy(layer.router.kernel)  # (N, E)
        counts = np.bincount(np.argsort(-logits, axis=-1)[:, :k].reshape(-1), minlength=experts)
        capacity = min(counts.max(), 2 * tokens * k // experts)  # every expert's first C rows, batched
        expected = router + (experts * capacity + np.maximum(counts - capacity, 0).sum()) * per_row
    if keras.config.backend() == "tensorflow" and not training and tokens * k > experts:
        # Keras's TensorFlow `ops.map` runs its function once more, outside the loop, for the output's signature (a
        # stateful branch, which `tf.function` keeps): one block more.
        expected += rows * per_row
    assert flops == expected
    # Dense all-expert compute would be 1.0 of this; PyTorch's batched part may pad to 2 N k rows, plus the overflow.
    assert flops < (0.4 if keras.config.backend() == "torch" else 0.25) * tokens * experts * per_row
    if tokens == 1:
        assert (rows, blocks) == (1, k)  # a decoding step reads k experts' weights


def test_in_a_decoder_block_with_router_logits(rng):
    x = rng.standard_normal((2, 4, D)).astype("float32")
    moe = dict(num_experts=4, top_k=2, intermediate_dim=I)
    block = TransformerDecoderBlock(2, 16, norm_first=True, norm_type="rms_norm", mixture_of_experts=moe)
    y, logits = block(x, return_router_logits=True)
    assert tuple(logits.shape) == (8, 4)
    assert_close(y, to_numpy(block(x)))
    assert isinstance(block.feed_forward, MixtureOfExperts)
    dense = TransformerDecoderBlock(2, 16)
    with pytest.raises(ValueError, match="return_router_logits"):
        dense(x, return_router_logits=True)
    restored = TransformerDecoderBlock.from_config(block.get_config())
    assert restored.get_config()["mixture_of_experts"] == moe


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(num_experts=4, top_k=5, intermediate_dim=8), "top_k=5"),
        (dict(num_experts=0, top_k=1, intermediate_dim=8), "num_experts=0"),
        (dict(num_experts=4, top_k=2, intermediate_dim=8, activation="tanh"), "activation='tanh'"),
        (dict(num_experts=4, top_k=2, intermediate_dim=8, shared_expert_gate=True), "shared_expert_gate"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MixtureOfExperts(**kwargs)


def test_block_refuses_unknown_options():
    with pytest.raises(ValueError, match="router_jitter"):
        TransformerDecoderBlock(
            2, 16, mixture_of_experts=dict(num_experts=4, top_k=2, intermediate_dim=8, router_jitter=0.1)
        )


def test_config_round_trip_and_saving(rng, tmp_path):
    x = rng.standard_normal((2, 3, D)).astype("float32")
    layer = _built(
        rng,
        x,
        num_experts=4,
        top_k=2,
        intermediate_dim=I,
        normalize_top_k=False,
        shared_intermediate_dim=4,
        shared_expert_gate=True,
    )
    restored = MixtureOfExperts.from_config(layer.get_config())
    assert restored.get_config() == layer.get_config()
    model = wrap_in_model(layer, {"x": (x.shape[1:], "float32")}, lambda layer, inputs: layer(inputs["x"]))
    assert_close(save_and_load(model, tmp_path)(x), to_numpy(layer(x)))
