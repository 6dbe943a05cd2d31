"""Data and model parallelism with Keras 3's distribution API (`keras.distribution`, JAX only).

Axes: V vocabulary, D model width, H heads (Hkv key/value heads), Dh head size, F feed-forward width,
E experts, I one expert's width (a mixture of experts).

The layout is Megatron-LM's tensor parallelism (Shoeybi et al. 2019), written as
regular expressions over `variable.path` for a `keras.distribution.LayoutMap`:

    attention query/key/value kernels (D, H, Dh) -> (None, model, None)   column parallel: heads split
              query/key/value biases  (H, Dh)    -> (model, None)
              output kernel           (H, Dh, D) -> (model, None, None)   row parallel: one all-reduce
    feed-forward intermediate/gate    (D, F)     -> (None, model)         column parallel
                 their biases         (F,)       -> (model,)
                 output kernel        (F, D)     -> (model, None)         row parallel: one all-reduce
    token embedding                   (V, D)     -> (model, None)         vocabulary parallel, when V
                                                 or (None, model)         divides by the model axis size
    mixture of experts: stacked experts' gate/up (E, D, I) -> (None, None, model)  column parallel in every expert
                        stacked experts' down    (E, I, D) -> (None, model, None)  row parallel: one all-reduce
                        shared expert            as the feed-forward above

Everything else (norms, position tables, output biases, task heads, a mixture of experts' router) is replicated.
The experts are split inside each expert (along I, Megatron's feed-forward split), not across experts:
`MixtureOfExperts` gathers each block's one expert's weights along E, a gather that stays on the device
when E is not split, and every device then runs every active expert's slice, as the dense feed-forward does.
With heads split, each device runs whole attention heads and whole feed-forward
columns: a block needs only two all-reduces (after attention, after the feed-forward).
The token embedding is split along the vocabulary, as Megatron does, because our
language-model heads reuse it (tied weights): the logits (B, T, V), the largest
activation, then stay split along V and no device holds all of them. Vocabularies
that do not divide (GPT-2's 50257, BERT's 30522) are split along D instead, which
any model axis dividing the heads also divides.

In Keras 3.15 the distribution API is implemented for JAX only; on TensorFlow
and PyTorch every entry point here raises one `NotImplementedError` saying so.
"""

import re

import keras

# (regex over variable paths, what the split dimension is, layout with "model" for the model axis)
_ATTENTION = r"(?:.*/)?[^/]*attention/"
_FEED_FORWARD = r"(?:.*/)?feed_forward/"
_SHARED_EXPERT = _FEED_FORWARD + r"shared_expert/"
_RULES = (
    (_ATTENTION + r"(?:query|key|value)/kernel", "attention heads", (None, "model", None)),
    (_ATTENTION + r"(?:query|key|value)/bias", "attention heads", ("model", None)),
    (_ATTENTION + r"attention_output/kernel", "attention heads", ("model", None, None)),
    (_FEED_FORWARD + r"(?:intermediate|gate)/kernel", "feed-forward width (intermediate_dim)", (None, "model")),
    (_FEED_FORWARD + r"(?:intermediate|gate)/bias", "feed-forward width (intermediate_dim)", ("model",)),
    (_FEED_FORWARD + r"output/kernel", "feed-forward width (intermediate_dim)", ("model", None)),
    (
        _FEED_FORWARD + r"(?:gate|up)_kernel",
        "expert width (mixture_of_experts intermediate_dim)",
        (None, None, "model"),
    ),
    (_FEED_FORWARD + r"down_kernel", "expert width (mixture_of_experts intermediate_dim)", (None, "model", None)),
    (
        _SHARED_EXPERT + r"(?:intermediate|gate)/kernel",
        "shared expert width (shared_intermediate_dim)",
        (None, "model"),
    ),
    (_SHARED_EXPERT + r"output/kernel", "shared expert width (shared_intermediate_dim)", ("model", None)),
)
_TOKEN_EMBEDDING = r"(?:.*/)?token_embedding/embeddings"


def check_backend(what="The Keras distribution API"):
    """Raise a `NotImplementedError` unless the backend is JAX, the only one Keras 3.15 distributes."""
    backend = keras.config.backend()
    if backend != "jax":
        raise NotImplementedError(
            f"{what} needs the JAX backend: in Keras {keras.__version__}, `keras.distribution` (DeviceMesh, "
            f"LayoutMap, DataParallel, ModelParallel) is implemented only for JAX. The current backend is "
            f"{backend!r}: set KERAS_BACKEND=jax before importing Keras to train on several devices, or train "
            "on one device with this backend."
        )


def megatron_layout_map(model, device_mesh, model_axis="model", batch_axis="batch"):
    """A `keras.distribution.LayoutMap` sharding `model` along `model_axis` in the Megatron pattern.

    The keys are regular expressions over variable paths (see the module docstring),
    so the map also serves a fresh copy of the same architecture built under the
    distribution's scope. Every variable of `model` is checked now: a dimension
    that does not divide by the model axis size is an error naming the variable.

    Args:
        model: a backbone or task; its variables are checked against the layout.
        device_mesh: a `keras.distribution.DeviceMesh` with an axis named `model_axis`.
        model_axis: str, the mesh axis the weights are split along.
        batch_axis: str or None, the mesh axis the batch is split along (data
            parallelism); it must be a mesh axis other than `model_axis`.

    Returns:
        A `keras.distribution.LayoutMap` for
        `keras.distribution.ModelParallel(layout_map=..., batch_dim_name=batch_axis)`.

    Example:
    >>> # Needs 8 devices and the JAX backend: not run by the tests (docs/distribution.md simulates them).
    >>> from keras_transformer.models import GPTBackbone, GPTCausalLM  # doctest: +SKIP
    >>> backbone = GPTBackbone.from_preset("gpt_small", load_weights=False)  # doctest: +SKIP
    >>> mesh = keras.distribution.DeviceMesh((2, 4), ("batch", "model"))  # all 8 devices  # doctest: +SKIP
    >>> layout_map = megatron_layout_map(backbone, mesh)  # doctest: +SKIP
    >>> with keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name="batch").scope():  # doctest: +SKIP
    ...     lm = GPTCausalLM.from_preset("gpt_small")
    """
    check_backend("A layout map")
    if not isinstance(device_mesh, keras.distribution.DeviceMesh):
        raise ValueError(
            f"`device_mesh` must be a `keras.distribution.DeviceMesh`. Received: device_mesh={device_mesh!r}"
        )
    axis_names = tuple(device_mesh.axis_names)
    if model_axis not in axis_names:
        raise ValueError(
            f"`model_axis` must name an axis of the device mesh {axis_names}. Received: model_axis={model_axis!r}"
        )
    if batch_axis is not None and (batch_axis not in axis_names or batch_axis == model_axis):
        raise ValueError(
            f"`batch_axis` must name an axis of the device mesh {axis_names} other than "
            f"model_axis={model_axis!r}, or be None. Received: batch_axis={batch_axis!r}"
        )
    size = device_mesh.shape[axis_names.index(model_axis)]

    layout_map = keras.distribution.LayoutMap(device_mesh)
    for pattern, _, axes in _RULES:
        layout_map[pattern] = _named(axes, model_axis)
    vocabulary_size = _token_embedding_rows(model)
    vocabulary_parallel = vocabulary_size is None or vocabulary_size % size == 0
    layout_map[_TOKEN_EMBEDDING] = _named(("model", None) if vocabulary_parallel else (None, "model"), model_axis)

    for variable in model.variables:
        layout = layout_map[variable.path]
        if layout is not None:
            _check_divisible(variable, layout.axes, model_axis, size)
    return layout_map


def model_parallel(model, device_mesh, model_axis="model", batch_axis="batch"):
    """A `keras.distribution.ModelParallel` for `model` (a backbone or a task) on `device_mesh`.

    Args:
        model: a backbone, or a task (its `backbone` is used).
        device_mesh: a `keras.distribution.DeviceMesh`, or a shape `(batch, model)` such
            as `(2, 4)` for a mesh over all devices with axes `(batch_axis, model_axis)`.
        model_axis: str, the mesh axis the weights are split along.
        batch_axis: str, the mesh axis the batch is split along.

    Returns:
        `keras.distribution.ModelParallel(layout_map=model.get_layout_map(...), batch_dim_name=batch_axis)`;
        build (or load) the model inside its `scope()`, or `keras.distribution.set_distribution` it.

    Example:
    >>> # Needs 8 devices and the JAX backend: not run by the tests (docs/distribution.md simulates them).
    >>> from keras_transformer.models import GPTBackbone, GPTCausalLM  # doctest: +SKIP
    >>> backbone = GPTBackbone.from_preset("gpt_small", load_weights=False)  # doctest: +SKIP
    >>> distribution = model_parallel(backbone, (2, 4))  # doctest: +SKIP
    >>> with distribution.scope():  # doctest: +SKIP
    ...     lm = GPTCausalLM.from_preset("gpt_small")
    """
    check_backend("Model parallelism")
    backbone = getattr(model, "backbone", model)
    if isinstance(device_mesh, (tuple, list)):
        device_mesh = _mesh(tuple(device_mesh), (batch_axis, model_axis))
    layout_map = backbone.get_layout_map(device_mesh, model_axis=model_axis, batch_axis=batch_axis)
    return keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name=batch_axis)


def data_parallel(devices=None):
    """A `keras.distribution.DataParallel` over `devices` (default: all of them): replicated weights, split batch.

    Example:
    >>> # Needs several devices and the JAX backend: not run by the tests (docs/distribution.md simulates them).
    >>> from keras_transformer.models import GPTCausalLM  # doctest: +SKIP
    >>> with data_parallel().scope():  # doctest: +SKIP
    ...     lm = GPTCausalLM.from_preset("gpt_tiny")
    ...     lm.fit(texts, batch_size=8 * keras.distribution.get_device_count())
    """
    check_backend("Data parallelism")
    return keras.distribution.DataParallel(devices=devices or keras.distribution.list_devices())


# --- helpers ----------------------------------------------------------------


def _named(axes, model_axis):
    return tuple(model_axis if axis == "model" else axis for axis in axes)


def _token_embedding_rows(model):
    for variable in model.variables:
        if _fullmatch(_TOKEN_EMBEDDING, variable.path):
            return variable.shape[0]
    return None


def _fullmatch(pattern, path):
    return re.fullmatch(pattern, path) is not None


def _check_divisible(variable, axes, model_axis, size):
    """A ValueError naming the variable, its dimension and the mesh axis when a split would be uneven."""
    shape = tuple(variable.shape)
    if len(axes) != len(shape):
        raise ValueError(
            f"The layout {axes} of variable '{variable.path}' has {len(axes)} axes but the variable has shape {shape}."
        )
    for dimension, axis in enumerate(axes):
        if axis == model_axis and shape[dimension] % size:
            meaning = next((words for pattern, words, _ in _RULES if _fullmatch(pattern, variable.path)), None)
            meaning = meaning or ("vocabulary" if dimension == 0 else "model width")
            raise ValueError(
                f"Cannot shard variable '{variable.path}' of shape {shape} along mesh axis '{model_axis}' of size "
                f"{size}: its dimension {dimension} ({meaning}) has size {shape[dimension]}, which is not "
                f"divisible by {size}. Use a '{model_axis}' axis whose size divides {shape[dimension]}."
            )


def _mesh(shape, axis_names):
    devices = keras.distribution.list_devices()
    if len(shape) != 2 or any(not isinstance(n, int) or n < 1 for n in shape) or shape[0] * shape[1] != len(devices):
        raise ValueError(
            f"A mesh shape must be (batch, model) positive ints whose product is the number of devices "
            f"({len(devices)}). Received: device_mesh={shape}"
        )
    return keras.distribution.DeviceMesh(shape, axis_names, devices)
