"""The ONNX converter: one `graphs.Graph` (a traced TensorFlow function) -> a checked ONNX model.

tf2onnx converts the graph (with handlers for the two TensorFlow ops it lacks); the result is put
in a canonical form (node order and names derived from the graph's structure), so that exports of
the same weights are the same bytes whatever backend or process made them. Graphs built in ONNX
directly (`decode_graph.py`) pass through as they are. Writing the bundle around the converted
graphs is `onnx.py`'s job.

Runs under the TensorFlow backend (see `keras_transformer.export`).
"""

import contextlib
import hashlib
import heapq
import logging
import os

OPSET = 17  # tf2onnx 1.17 supports opsets up to 18; 17 is what ONNX Runtime >= 1.14 runs everywhere.


def convert(graph, weights=None):
    """One `graphs.Graph` -> a checked ONNX ModelProto with named dynamic axes (a graph built in ONNX as it is).

    With `weights` (a `weights_file.WeightsFile`), the variables the graph reads are traced as inputs, so
    TensorFlow and tf2onnx handle the graph's structure only (a model's worth of constants made them copy every
    weight at each pass: minutes and gigabytes for a 100M-parameter model), and come back as initializers whose
    bytes are in the weights file, as do the other large constants; the model is checked before they are.
    """
    if graph.model is not None:
        return graph.model
    import tensorflow as tf

    logging.getLogger("tf2onnx").setLevel(logging.ERROR)
    tf_logger = tf.get_logger()
    level = tf_logger.level
    tf_logger.setLevel(logging.ERROR)  # the TF1 freezing functions tf2onnx calls warn they are deprecated
    try:
        model = _convert(graph, weights is not None)
    finally:
        tf_logger.setLevel(level)
    if weights is not None:
        _attach_weights(model, graph.variables, weights)
    return model


def _weight_name(index):
    return f"weight.{index}"


def _traced(graph, weights_as_inputs):
    """(tf.function, its input specs): the graph's own, or with the graph's variables as further inputs."""
    if not weights_as_inputs or not graph.variables:
        return graph.function, list(graph.inputs)
    import keras
    import tensorflow as tf

    count, variables = len(graph.inputs), list(graph.variables)
    specs = [tf.TensorSpec(v.shape, v.dtype, name=_weight_name(i)) for i, v in enumerate(variables)]

    def with_weights(*args):
        # Inside a StatelessScope every read of a variable gives the tensor mapped to it: the weight input.
        with keras.StatelessScope(state_mapping=list(zip(variables, args[count:]))):
            return graph.function.python_function(*args[:count])

    return tf.function(with_weights, autograph=False), list(graph.inputs) + specs


def _attach_weights(model, variables, weights):
    """The weight inputs the graph reads -> initializers in `weights`; unread ones dropped; every other large
    initializer (a captured table) moved into `weights` as well."""
    import keras
    from onnx import TensorProto, numpy_helper

    graph = model.graph
    names = {_weight_name(i): variable for i, variable in enumerate(variables)}
    read = {name for node in graph.node for name in node.input}
    kept = [value for value in graph.input if value.name not in names]
    del graph.input[:]
    graph.input.extend(kept)
    initializers = [
        init if init.data_location == TensorProto.EXTERNAL else weights.tensor(init.name, numpy_helper.to_array(init))
        for init in graph.initializer
    ]
    initializers += [
        weights.tensor(name, keras.ops.convert_to_numpy(variable)) for name, variable in names.items() if name in read
    ]
    del graph.initializer[:]
    graph.initializer.extend(initializers)


def _convert(graph, weights_as_inputs=False):
    import onnx
    import tensorflow as tf
    import tf2onnx

    traced, specs = _traced(graph, weights_as_inputs)
    function = traced.get_concrete_function(*specs)
    # The graph inputs are the signature's (and the weights); constants the layers captured (e.g. a sinusoid
    # table) are further function inputs that freezing turns into initializers.
    input_names = [tensor.name for tensor in function.inputs[: len(specs)]]
    output_names = [tensor.name for tensor in function.outputs]
    renames = tf2onnx.convert.tensor_names_from_structed(function, input_names, output_names)
    with tf.device("/cpu:0"):
        graph_def = tf2onnx.tf_loader.from_function(function, input_names, output_names)
    with _linear_tf2onnx_passes():
        model, _ = tf2onnx.convert.from_graph_def(
            graph_def,
            name=graph.name,
            input_names=input_names,
            output_names=output_names,
            opset=OPSET,
            custom_op_handlers=_CUSTOM_OP_HANDLERS,
            tensors_to_rename=renames,
        )
    expected = [spec.name for spec in specs]
    got = [value.name for value in model.graph.input]
    if got != expected:
        raise RuntimeError(f"The {graph.name} graph's inputs are {got}, expected {expected}.")
    for value in list(model.graph.input) + list(model.graph.output):
        for dim, axis in zip(value.type.tensor_type.shape.dim, graph.axes.get(value.name, ())):
            if axis is not None:
                dim.dim_param = axis
    # Sizes TensorFlow knows statically that tf2onnx's own inference lost (e.g. through Pad + Where).
    for value, tensor in zip(model.graph.output, function.outputs):
        axes = graph.axes.get(value.name, ())
        for i, (dim, size) in enumerate(zip(value.type.tensor_type.shape.dim, tensor.shape.as_list())):
            if size is not None and (i >= len(axes) or axes[i] is None):
                dim.dim_value = size  # replaces a generated dim_param (one of the two)
    _mean_over_features(model)
    _canonicalize(model)
    onnx.checker.check_model(model)
    return model


@contextlib.contextmanager
def _linear_tf2onnx_passes():
    """tf2onnx 1.17's optimizer passes, without two costs that grow with the square of the graph (a 30-layer prefill:
    minutes of the export; benchmarks/RESULTS.md, "Export of real checkpoints"):

    - after every pass it finds the nodes the outputs need by walking the graph once per output (one per cache: 61
      walks of a 30-layer prefill) and once per input; here one walk from all of them (the same set of nodes);
    - before every pass it deep-copies the whole graph, to go on without a pass that raises
      (`TF2ONNX_CATCH_ERRORS=FALSE`): a pass that fails here fails the export, which the export tests would see.
    """
    from tf2onnx.graph import Graph

    def extract_sub_graph_nodes(self, outputs_name, input_checker=None, remove_unused_inputs=True):
        outputs = list(outputs_name) + ([] if remove_unused_inputs else [node.output[0] for node in self.inputs])
        found, pending = set(), []
        for name in outputs:
            node = self.get_node_by_output(name, search_in_parent_graphs=False)
            if node and node not in found and not (input_checker and input_checker(node) is False):
                found.add(node)
                pending.append(node)
        while pending:
            node = pending.pop()
            for name in list(node.input) + list(node.get_implicit_inputs()):
                source = self.get_node_by_output(name, search_in_parent_graphs=False)
                if source and source not in found and not (input_checker and input_checker(source) is False):
                    found.add(source)
                    pending.append(source)
        return list(found)

    original, previous = Graph.extract_sub_graph_nodes, os.environ.get("TF2ONNX_CATCH_ERRORS")
    Graph.extract_sub_graph_nodes = extract_sub_graph_nodes
    os.environ["TF2ONNX_CATCH_ERRORS"] = "FALSE"
    try:
        yield
    finally:
        Graph.extract_sub_graph_nodes = original
        if previous is None:
            os.environ.pop("TF2ONNX_CATCH_ERRORS", None)
        else:
            os.environ["TF2ONNX_CATCH_ERRORS"] = previous


def _canonicalize(model):
    """Deterministic node order and names, so that the same graph gives the same bytes.

    tf2onnx's node names and the order of independent nodes vary between processes
    (counters, hash seeds). Nodes are ordered topologically with ties broken by a hash of
    their structure (op, attributes, and recursively their inputs), equal initializers are
    merged, and every name but the graph's inputs and outputs is derived from positions:
    exports of the same weights are then identical files, whatever backend or process made them.
    """
    import onnx

    graph = model.graph
    subgraphs = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
    if any(attribute.type in subgraphs for node in graph.node for attribute in node.attribute):
        return  # control flow: left as converted
    initializers = {t.name: t for t in graph.initializer}
    keep = {value.name for value in list(graph.input) + list(graph.output)}
    init_keys, node_keys = _structure_keys(graph, initializers, keep)
    nodes = _topological_order(graph, node_keys)
    new_initializers = _rename_by_position(nodes, initializers, init_keys, keep)
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.initializer[:]
    graph.initializer.extend(new_initializers)
    del graph.value_info[:]


def _digest(*parts):
    """A sha256 hex digest of the parts: bytes as they are, anything else by its repr, each ended by a NUL."""
    h = hashlib.sha256()
    for part in parts:
        h.update(part if isinstance(part, bytes) else repr(part).encode())
        h.update(b"\0")
    return h.hexdigest()


def _structure_keys(graph, initializers, keep):
    """-> ({initializer name: hash of its dtype, dims and bytes}, [each node's hash, in graph order]).

    A node's hash covers its op, its attributes and its inputs' hashes (a graph input hashes as its
    name, an initializer as its contents, a node output as its node's hash and index): equal
    structures hash equal whatever tf2onnx named them.
    """
    from onnx import numpy_helper

    init_keys = {
        name: _digest("const", t.data_type, tuple(t.dims), numpy_helper.to_array(t).tobytes())
        for name, t in initializers.items()
    }
    tensor_keys = {name: "input:" + name for name in keep}
    tensor_keys.update(init_keys)
    node_keys = []
    for node in graph.node:  # ONNX nodes are in topological order: inputs are keyed first
        attributes = sorted((a.name, a.SerializeToString()) for a in node.attribute)
        key = _digest(node.domain, node.op_type, attributes, [tensor_keys.get(name, "") for name in node.input])
        node_keys.append(key)
        for j, name in enumerate(node.output):
            tensor_keys[name] = _digest(key, j)
    return init_keys, node_keys


def _topological_order(graph, node_keys):
    """Copies of the graph's nodes in topological order, the ready node with the smallest key first."""
    import onnx

    producer = {name: i for i, node in enumerate(graph.node) for name in node.output}
    consumers = [[] for _ in graph.node]
    waiting = []  # per node: how many of the nodes it reads are not placed yet
    for i, node in enumerate(graph.node):
        dependencies = {producer[name] for name in node.input if name in producer}
        waiting.append(len(dependencies))
        for d in dependencies:
            consumers[d].append(i)
    ready = [(node_keys[i], i) for i, count in enumerate(waiting) if count == 0]
    heapq.heapify(ready)
    nodes = []
    while ready:
        _, i = heapq.heappop(ready)
        nodes.append(onnx.NodeProto.FromString(graph.node[i].SerializeToString()))
        for c in consumers[i]:
            waiting[c] -= 1
            if waiting[c] == 0:
                heapq.heappush(ready, (node_keys[c], c))
    return nodes


def _rename_by_position(nodes, initializers, init_keys, keep):
    """Name the nodes and their tensors by position, in place; equal initializers become one.

    A node is `{Op}_{position}`, its outputs `{op}_{position}[_{j}]` (the graph's inputs and outputs
    keep their names), and initializers `const_{k}` in order of first use.
    Returns the merged, renamed initializers.
    """
    import onnx

    renames, first_by_key, new_initializers = {}, {}, []
    for position, node in enumerate(nodes):
        for name in node.input:
            if name in initializers and name not in renames:
                key = init_keys[name]
                if key not in first_by_key:
                    first_by_key[key] = f"const_{len(new_initializers)}"
                    tensor = onnx.TensorProto.FromString(initializers[name].SerializeToString())
                    tensor.name = first_by_key[key]
                    new_initializers.append(tensor)
                renames[name] = first_by_key[key]
        for j, name in enumerate(node.output):
            if name and name not in keep:
                renames[name] = f"{node.op_type.lower()}_{position}" + (f"_{j}" if j else "")
        node.name = f"{node.op_type}_{position}"
        node.doc_string = ""
    for node in nodes:
        node.input[:] = [renames.get(name, name) for name in node.input]
        node.output[:] = [renames.get(name, name) for name in node.output]
    return new_initializers


def _mean_over_features(model):
    """Give back tf2onnx's GlobalAveragePool over (B, T, D) its ReduceMean(axis -1) form.

    tf2onnx turns a mean over the last axis of a rank-3 tensor into GlobalAveragePool (the
    same numbers); as ReduceMean, layer norms match ONNX Runtime's LayerNormalization fusion.
    """
    import onnx
    from onnx import helper

    inferred = onnx.shape_inference.infer_shapes(model).graph
    ranks = {
        value.name: len(value.type.tensor_type.shape.dim)
        for value in list(inferred.value_info) + list(inferred.input) + list(inferred.output)
        if value.type.tensor_type.HasField("shape")
    }
    for node in model.graph.node:
        rank = ranks.get(node.input[0]) if node.op_type == "GlobalAveragePool" else None
        if rank is not None and rank >= 3:  # GlobalAveragePool == ReduceMean over axes 2..rank-1, kept
            node.op_type = "ReduceMean"
            del node.attribute[:]
            node.attribute.extend(
                [helper.make_attribute("axes", list(range(2, rank))), helper.make_attribute("keepdims", 1)]
            )


def _dynamic_update_slice(ctx, node, name, args):
    """tf2onnx handler for XlaDynamicUpdateSlice (a multi-token cache write): Pad + Where.

    ONNX has no dynamic-update-slice; writing `update` into `operand` at `starts` is
    where(pad(ones_like(update)), pad(update), operand), padding by `starts` before and
    the rest after. Starts are clamped as XLA does, so the update always fits.
    """
    import numpy as np
    from onnx import TensorProto, helper
    from tf2onnx import utils

    operand, update, starts = node.input
    operand_shape = ctx.make_node("Shape", [operand]).output[0]
    update_shape = ctx.make_node("Shape", [update]).output[0]
    starts = ctx.make_node("Cast", [starts], attr={"to": TensorProto.INT64}).output[0]
    last_start = ctx.make_node("Sub", [operand_shape, update_shape]).output[0]
    zero = ctx.make_const(utils.make_name("zero"), np.zeros([1], np.int64)).output[0]
    starts = ctx.make_node("Min", [starts, last_start]).output[0]
    starts = ctx.make_node("Max", [starts, zero]).output[0]
    after = ctx.make_node("Sub", [last_start, starts]).output[0]
    pads = ctx.make_node("Concat", [starts, after], attr={"axis": 0}).output[0]
    padded = ctx.make_node("Pad", [update, pads]).output[0]
    one = helper.make_tensor("value", TensorProto.UINT8, [1], [1])
    inside = ctx.make_node("ConstantOfShape", [update_shape], attr={"value": one}).output[0]
    inside = ctx.make_node("Pad", [inside, pads]).output[0]
    inside = ctx.make_node("Cast", [inside], attr={"to": TensorProto.BOOL}).output[0]
    node.type = "Where"
    ctx.replace_inputs(node, [inside, padded, operand])


def _erfc(ctx, node, name, args):
    """tf2onnx handler for Erfc (TensorFlow's exact gelu): erfc(x) = 1 - erf(x)."""
    import numpy as np
    from tf2onnx import utils

    dtype = utils.map_onnx_to_numpy_type(ctx.get_dtype(node.input[0]))
    one = ctx.make_const(utils.make_name("one"), np.ones([], dtype)).output[0]
    erf = ctx.make_node("Erf", [node.input[0]]).output[0]
    node.type = "Sub"
    ctx.replace_inputs(node, [one, erf])


# TensorFlow ops tf2onnx 1.17 does not convert, and their ONNX equivalents.
_CUSTOM_OP_HANDLERS = {"XlaDynamicUpdateSlice": (_dynamic_update_slice, []), "Erfc": (_erfc, [])}
