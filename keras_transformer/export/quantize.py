"""Quantized ONNX bundles: 8- or 4-bit weights.

A causal LM's graphs, built by the ONNX kernels, store their weights quantized as they are built
(`decode_graph._Builder.matmul` / `gather`, with `int8_weight` and `int4_blocks` below: the same
formats as the rewrite below). A bundle with a traced graph is quantized by this module after it is
written, on its `.onnx` files only (`quantize_bundle`). The runner needs nothing new either way (the
quantized operators are ONNX Runtime's own CPU kernels).
- "int8": ONNX Runtime's `quantize_dynamic`: weights of MatMul and Gather (embedding tables)
  stored as int8 with a scale, activations quantized on the fly (DynamicQuantizeLinear + MatMulInteger).
- "int4": embedding tables as above, then every MatMul with a constant (K, N) weight becomes
  `com.microsoft.MatMulNBits` (4-bit blocks of 32 along K, a scale and zero point per block),
  packed by ONNX Runtime's own `quantize_matmul_4bits`. (ORT's `MatMulNBitsQuantizer` does the
  same but needs the `onnx_ir` package, which the export extra does not install.)
Each graph first goes through ONNX Runtime's pre-quantization pass (`quant_pre_process`: its basic graph
optimizations, constant folding among them), so weights the traced prefill reshapes at run time become the
constant operands the quantizers need; then Gemm nodes with a constant weight are rewritten as MatMul + Add,
which both modes quantize.
"""

from pathlib import Path

import numpy as np

from keras_transformer.progress import Phase
from keras_transformer.export.weights_file import FILE_NAME as WEIGHTS_FILE

MODES = ("int8", "int4")
BLOCK_SIZE = 32  # MatMulNBits block along K
# MatMulNBits' attributes besides K and N: accuracy level 4 takes int8 products of the activations with the 4-bit
# weights.
NBITS_ATTRIBUTES = {"bits": 4, "block_size": BLOCK_SIZE, "accuracy_level": 4}


def check_mode(quantize):
    if quantize is not None and quantize not in MODES:
        raise ValueError(f"`quantize` must be None or one of {MODES}. Received: quantize={quantize!r}")


def quantize_bundle(directory, mode, verbose=False):
    """Quantize every `.onnx` graph of the bundle in `directory` in place to `mode` ("int8" or "int4")."""
    check_mode(mode)
    for path in sorted(Path(directory).glob("*.onnx")):
        with Phase(f"{path.name}: rewritten with {mode} weights (ONNX Runtime's quantizers)", verbose):
            quantize_graph(path, mode)
    # Each quantized graph holds its own 8- or 4-bit weights: the float weights file is read by none of them.
    (Path(directory) / WEIGHTS_FILE).unlink(missing_ok=True)


def quantize_graph(path, mode):
    import onnx
    from onnxruntime.quantization import QuantType, quant_pre_process, quantize_dynamic

    path = Path(path)
    float_path = path.with_name(path.stem + ".float.onnx")
    inline_path = path.with_name(path.stem + ".inline.onnx")
    try:
        # The graph with its weights read in from the bundle's weights file: the pre-quantization pass copies the
        # graph into a directory of its own, where the weights file is not.
        onnx.save(onnx.load(str(path)), str(inline_path))
        # ONNX Runtime's pre-quantization pass (its basic graph optimizations: constant folding): a weight the
        # traced graph reshapes at run time (tf2onnx's einsums: Reshape(W, Concat(.., ReduceProd(Shape(W))))) becomes
        # the constant operand the quantizers need, and copies read only for their shape are dropped.
        quant_pre_process(str(inline_path), str(float_path), skip_symbolic_shape=True)
        model = onnx.load(str(float_path))
        _gemm_to_matmul(model.graph)
        onnx.save(model, str(float_path))
        # int8 weights for MatMul and Gather tables; int4 mode: the tables only (MatMuls follow).
        op_types = ["MatMul", "Gather"] if mode == "int8" else ["Gather"]
        quantize_dynamic(
            str(float_path),
            str(path),
            weight_type=QuantType.QInt8,
            op_types_to_quantize=op_types,
            extra_options={"MatMulConstBOnly": True, "DefaultTensorType": onnx.TensorProto.FLOAT},
        )
    finally:
        float_path.unlink(missing_ok=True)
        inline_path.unlink(missing_ok=True)
    if mode == "int4":
        model = onnx.load(str(path))
        _matmul_to_nbits(model.graph)
        if not any(opset.domain == "com.microsoft" for opset in model.opset_import):
            model.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
        onnx.save(model, str(path))


def int8_weight(array):
    """A weight (float32 numpy) as `quantize_dynamic` stores it: (int8 array, scale () float32, zero point () int8),
    per tensor and symmetric (ONNX Runtime's own `quantize_data`)."""
    from onnx import TensorProto
    from onnxruntime.quantization.quant_utils import quantize_data

    zero_point, scale, quantized = quantize_data(np.asarray(array, np.float32), TensorProto.INT8, symmetric=True)
    return np.asarray(quantized, np.int8).reshape(np.shape(array)), np.float32(scale), np.int8(zero_point)


def int4_blocks(array):
    """A MatMul weight (K, N) float32 -> MatMulNBits' (packed (N, K / 32, 16) uint8, scales, zero points): blocks of
    32 along K, packed by ONNX Runtime's own `quantize_matmul_4bits`."""
    from onnxruntime.capi._pybind_state import quantize_matmul_4bits

    rows, cols = array.shape  # (K, N)
    blocks = (rows + BLOCK_SIZE - 1) // BLOCK_SIZE
    padded = np.pad(np.asarray(array, np.float32), ((0, blocks * BLOCK_SIZE - rows), (0, 0)))
    packed = np.zeros((cols, blocks, BLOCK_SIZE // 2), np.uint8)
    scales = np.zeros(cols * blocks, np.float32)
    zero_points = np.zeros(cols * ((blocks + 1) // 2), np.uint8)
    quantize_matmul_4bits(packed, np.ascontiguousarray(padded), scales, zero_points, BLOCK_SIZE, cols, rows, False)
    return packed, scales, zero_points


def _initializers(graph):
    return {init.name: init for init in graph.initializer}


def _gemm_to_matmul(graph):
    """Gemm(A, B const, C) with alpha = 1 (and beta = 1 with a C), transA = 0 -> MatMul(A, B') (+ Add C)."""
    from onnx import helper, numpy_helper

    inits = _initializers(graph)
    nodes = []
    for node in graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        has_bias = node.op_type == "Gemm" and len(node.input) > 2 and bool(node.input[2])
        if (
            node.op_type != "Gemm"
            or node.input[1] not in inits
            or attrs.get("transA", 0)
            or attrs.get("alpha", 1.0) != 1.0
            or (has_bias and attrs.get("beta", 1.0) != 1.0)
        ):
            nodes.append(node)
            continue
        weight_name = node.input[1]
        if attrs.get("transB", 0):  # (N, K) -> (K, N), as a new initializer
            weight = numpy_helper.to_array(inits[weight_name]).T
            weight_name = f"{node.input[1]}_transposed_{node.name}"
            graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(weight), weight_name))
        product = f"{node.output[0]}_matmul" if has_bias else node.output[0]
        nodes.append(helper.make_node("MatMul", [node.input[0], weight_name], [product], name=f"{node.name}_matmul"))
        if has_bias:
            nodes.append(helper.make_node("Add", [product, node.input[2]], [node.output[0]], name=f"{node.name}_add"))
    del graph.node[:]
    graph.node.extend(nodes)
    _drop_unused_initializers(graph)


def _matmul_to_nbits(graph):
    """MatMul(x, W const (K, N) float32) -> com.microsoft.MatMulNBits(x, packed, scales, zero_points)."""
    from onnx import helper, numpy_helper

    inits = _initializers(graph)
    nodes = []
    for node in graph.node:
        weight = inits.get(node.input[1]) if node.op_type == "MatMul" and node.domain in ("", "ai.onnx") else None
        array = None if weight is None else numpy_helper.to_array(weight)
        if array is None or array.ndim != 2 or array.dtype != np.float32:
            nodes.append(node)
            continue
        rows, cols = array.shape  # (K, N)
        packed, scales, zero_points = int4_blocks(array)
        name = node.input[1]
        graph.initializer.extend(
            [
                numpy_helper.from_array(packed, f"{name}_Q4"),
                numpy_helper.from_array(scales, f"{name}_scales"),
                numpy_helper.from_array(zero_points, f"{name}_zero_points"),
            ]
        )
        nodes.append(
            helper.make_node(
                "MatMulNBits",
                [node.input[0], f"{name}_Q4", f"{name}_scales", f"{name}_zero_points"],
                list(node.output),
                name=f"{node.name}_Q4",
                domain="com.microsoft",
                K=rows,
                N=cols,
                **NBITS_ATTRIBUTES,
            )
        )
    del graph.node[:]
    graph.node.extend(nodes)
    _drop_unused_initializers(graph)


def _drop_unused_initializers(graph):
    used = {name for node in graph.node for name in node.input} | {o.name for o in graph.output}
    _used_in_subgraphs(graph, used)
    keep = [init for init in graph.initializer if init.name in used]
    del graph.initializer[:]
    graph.initializer.extend(keep)


def _used_in_subgraphs(graph, used):
    from onnx import helper

    for node in graph.node:
        for attribute in node.attribute:
            value = helper.get_attribute_value(attribute)
            for sub in value if isinstance(value, list) else [value]:
                if hasattr(sub, "node"):
                    used.update(name for n in sub.node for name in n.input)
                    _used_in_subgraphs(sub, used)
