"""Backbone: the base of every family's functional body (embeddings + blocks)."""

import keras

from keras_transformer import presets
from keras_transformer.distribution import megatron_layout_map
from keras_transformer.models import lora, quantization
from keras_transformer.models.input_checks import check_inputs


@presets.register_base_class("backbone")
class Backbone(keras.Model):
    """A functional Keras model from token ids (and masks) to hidden states.

    Subclasses build their layers and functional graph in `__init__` and
    store every constructor argument under the same name for `get_config`.
    Presets: `from_preset(name_or_dir)` and `save_to_preset(dir)`.
    """

    def __init__(self, *args, dtype=None, **kwargs):
        super().__init__(*args, dtype=dtype, **kwargs)
        # Functional models keep a float32 policy whatever `dtype` says; the layers got
        # `dtype` from the subclass, and get_config must hand the same value back.
        self._construction_dtype = self.dtype_policy if dtype is None else keras.dtype_policies.get(dtype)

    def __setattr__(self, name, value):
        functional_setattr(self, name, value, super().__setattr__)

    def __call__(self, *args, **kwargs):
        # Values of numpy inputs are checked on the host (a gather would clamp a bad id on JAX);
        # backend tensors pass unchecked: they may be traced, or a training step's batch.
        check_inputs(self, args[0] if args else kwargs.get("inputs"))
        return super().__call__(*args, **kwargs)

    def get_config(self):
        # The functional graph is rebuilt from the constructor arguments.
        dtype = keras.dtype_policies.serialize(self._construction_dtype)
        return {"name": self.name, "trainable": self.trainable, "dtype": dtype}

    @classmethod
    def from_config(cls, config):
        return cls(**config)

    @classmethod
    def from_preset(cls, preset, load_weights=True, **kwargs):
        """Build the backbone of `preset` (a registered name or a directory) and load its weights."""
        return presets.load_backbone(cls, preset, load_weights=load_weights, **kwargs)

    def save_to_preset(self, preset_dir, overwrite=True):
        """Write `config.json`, `model.weights.h5` and `metadata.json` to `preset_dir` (atomically)."""
        presets.save_backbone(self, preset_dir, overwrite=overwrite, quantization=quantization.quantization_mode(self))

    def get_layout_map(self, device_mesh, model_axis="model", batch_axis="batch"):
        """A `keras.distribution.LayoutMap` splitting heads, feed-forward and token embedding along `model_axis`.

        Megatron-style tensor parallelism for `keras.distribution.ModelParallel` (JAX only in Keras 3.15);
        see `keras_transformer.distribution.megatron_layout_map`, which reads the layers by type, so
        every family gets it from here.
        """
        return megatron_layout_map(self, device_mesh, model_axis=model_axis, batch_axis=batch_axis)

    # --- LoRA and quantized weights ------------------------------------------

    def enable_lora(self, rank, target_names=None):
        """Add rank-`rank` LoRA factors to the projections named `target_names`; only they train then.

        Built on Keras's `Dense.enable_lora` / `EinsumDense.enable_lora`. Every other weight of the
        backbone (embeddings, norms, biases, projections without LoRA) is frozen.

        Args:
            rank: int >= 1, the rank r of each update (kernel + A @ B, A (..., r), B (r, ...)).
            target_names: layer names, default `("query", "value")`, the attention query and value
                projections. Others: "key", "attention_output", "intermediate", "gate", "output", ...
                A name that matches no layer is a ValueError listing the available names.

        Example:
        >>> import os, tempfile
        >>> from keras_transformer.models import GPTBackbone
        >>> backbone = GPTBackbone(vocabulary_size=100, num_layers=2, num_heads=2, hidden_dim=16, intermediate_dim=32)
        >>> backbone.enable_lora(4)
        >>> len(backbone.trainable_weights)  # what `fit` trains now: A and B of query and value, in 2 layers
        8
        >>> backbone.save_lora_weights(os.path.join(tempfile.mkdtemp(), "adapter.lora.safetensors"))
        """
        lora.enable_lora(self, rank, target_names)

    def save_lora_weights(self, path):
        """Write only the LoRA factors (safetensors; rank and target names in its metadata) to `path`."""
        lora.save_lora_weights(self, path)

    def load_lora_weights(self, path):
        """Load factors written by `save_lora_weights` into this backbone, which must have LoRA enabled
        with the same rank and targets (else a ValueError, and nothing loads)."""
        lora.load_lora_weights(self, path)

    def merge_lora(self):
        """Fold each A @ B into its kernel and remove the factors: plain weights, all trainable again."""
        lora.merge_lora(self)

    def quantize(self, mode, config=None, **kwargs):
        """Quantize the Dense / EinsumDense weights to `mode` ("int8" or "int4"); embeddings stay float.

        `save_to_preset` records the mode, so `from_preset` rebuilds the backbone quantized.
        """
        if kwargs:
            raise ValueError(f"Unexpected arguments for quantize: {sorted(kwargs)}")
        quantization.quantize(self, mode, super().quantize, config)


def check_positive_ints(**values):
    """Raise a ValueError naming the first argument that is not a positive int."""
    for name, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"`{name}` must be a positive int. Received: {name}={value!r}")


def check_layer_list(name, values, num_layers, allowed):
    """None, or a list of `num_layers` entries from `allowed` (a per-layer option) -> a list or None.

    Raises:
        ValueError: naming the option, its value and what it must be.
    """
    if values is None:
        return None
    values = list(values)
    if len(values) != num_layers or any(value not in allowed for value in values):
        raise ValueError(
            f"`{name}` must be None or a list of num_layers={num_layers} entries, each one of {list(allowed)}. "
            f"Received: {name}={values!r}"
        )
    return values


def functional_setattr(model, name, value, default_setattr):
    """Let functional subclasses assign layers before `Model.__init__`, on every backend.

    torch.nn.Module refuses attributes before its __init__; everything such a
    model holds is reachable through its functional graph, so plain object
    attributes are enough until then.
    """
    if not hasattr(model, "_tracker") and keras.config.backend() == "torch":
        object.__setattr__(model, name, value)
    else:
        default_setattr(name, value)


def call_layer(layer, *args, **kwargs):
    """How a decoding step calls its layers unless told otherwise: through Keras.

    Every family's cached step (`call_with_cache`) takes a `call_layer` argument and calls its
    layers through it, so one description of the step serves every runtime: PyTorch's decoding
    loop passes `samplers.torch_kernels.TorchKernels`, plain-PyTorch kernels chosen by layer type.
    """
    return layer(*args, **kwargs)
