"""SharedLayerCalls: how the SavedModel's traced signatures call the model's layers, each kind of layer as one
TensorFlow function of its weights (see saved_model.py)."""

import json

import keras


class SharedLayerCalls:
    """`call_layer` for the traced loops: a layer runs as a TensorFlow function of its weights, one function per
    kind of layer (its class and configuration but its name, and its weights' shapes), called with each layer's own
    variables.

    The graphs then hold each kind of layer once per input signature (a decoder block for the prefill, one for
    the step) and a call per layer, where a layer called directly writes its whole computation into the graph
    at every call: every block of the model in the prefill, again in the step, and again in each signature. Those
    copies, not the weights, were the memory of tracing and saving (the function library, held by Python, by
    TensorFlow's graphs and by the saved protocol buffer).
    """

    takes_decode_head = True  # the loop's (D, V) head, made once outside the steps (see `decode_loop.run`)

    def __init__(self):
        self._functions = {}  # layer kind -> the tf.function of the first layer of that kind, of its weights

    def __call__(self, layer, *args, **kwargs):
        import tensorflow as tf

        weights, key = layer.weights, _layer_kind(layer)
        if not weights or key is None:  # nothing to share (a layer without weights is as small as a call)
            return layer(*args, **kwargs)
        if key not in self._functions:

            def run(values, args, kwargs, layer=layer):
                # The first layer's computation with the values of the layer called.
                with keras.StatelessScope(state_mapping=list(zip(layer.weights, values))):
                    return layer(*args, **kwargs)

            self._functions[key] = tf.function(run, autograph=False, reduce_retracing=True)
        function, values = self._functions[key], [weight.value for weight in weights]
        if any(
            captured.dtype == tf.resource
            for captured in function.get_concrete_function(values, args, kwargs).captured_inputs
        ):
            # The layer reads a variable that is not one of its weights: its function is not its kind's.
            return layer(*args, **kwargs)
        return function(values, args, kwargs)

    def model(self, model, inputs):
        """`model(inputs)`, each layer of a functional model (and of the functional models in it) called through
        these functions: Keras's own walk over the model's graph (`Functional.call`), at inference."""
        from keras.src.models.functional import Functional

        def plain(op):  # a functional model whose call is Keras's own
            return isinstance(op, Functional) and type(op).call is Functional.call

        if not plain(model):
            return model(inputs)

        def operation(op):
            if plain(op):  # its Keras call adds only masks and a training flag (None here)
                return lambda inputs, **kwargs: (
                    self.model(op, inputs)
                    if all(value is None for value in keras.tree.flatten(kwargs))
                    else op(inputs, **kwargs)
                )
            if isinstance(op, keras.layers.Layer):
                return lambda *args, **kwargs: self(op, *args, **kwargs)
            return op

        outputs = model._run_through_graph(model._standardize_inputs(inputs), operation_fn=operation)
        return outputs[0] if isinstance(outputs, (list, tuple)) and len(outputs) == 1 else outputs


def _layer_kind(layer):
    """What makes two layers compute the same function of their weights: class, configuration (but the name) and
    the weights' shapes and dtypes; None for a layer without a configuration."""
    try:
        config = {name: value for name, value in layer.get_config().items() if name != "name"}
    except NotImplementedError:  # Keras's answer for a layer built from arguments it cannot serialise
        return None
    shapes = tuple((tuple(weight.shape), str(weight.dtype)) for weight in layer.weights)
    return type(layer), json.dumps(config, sort_keys=True, default=repr), shapes


__all__ = ["SharedLayerCalls"]
