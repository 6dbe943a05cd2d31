"""Task: a backbone plus a head, trained with plain `fit` on raw strings or arrays."""

import os

import keras
from keras import ops

from keras_transformer import entry_points, presets
from keras_transformer.models import compiled_step, quantization
from keras_transformer.models.backbone import Backbone, functional_setattr
from keras_transformer.models.compiled_predict_step import CompiledPredictStep
from keras_transformer.models.compiled_test_step import CompiledTestStep
from keras_transformer.models.compiled_train_step import CompiledTrainStep
from keras_transformer.models.input_checks import check_finite, check_inputs
from keras_transformer.models.preprocessor import Preprocessor
from keras_transformer.models.raw_inputs import PreprocessedDataset, first_leaf_is_text, is_dataset


@presets.register_base_class("task")
class Task(keras.Model):
    """Base of the task models (causal LM, masked LM, classifier, seq2seq LM).

    A task is a functional Keras model over its backbone. When it has a
    preprocessor, `fit`, `evaluate` and `predict` also accept raw strings (a
    list, a `tf.data.Dataset` or a `keras.utils.PyDataset` of strings); they
    are tokenized in numpy, outside the compiled graph, on every backend.
    """

    backbone_cls = None
    preprocessor_cls = None

    def __setattr__(self, name, value):
        functional_setattr(self, name, value, super().__setattr__)

    def __call__(self, *args, **kwargs):
        check_inputs(self, args[0] if args else kwargs.get("inputs"))  # numpy inputs only, as Backbone
        return super().__call__(*args, **kwargs)

    # --- compile defaults -------------------------------------------------

    def compile(
        self, optimizer="auto", loss="auto", metrics="auto", weighted_metrics="auto", jit_compile="auto", **kwargs
    ):
        """Compile with this task's defaults; any argument can be overridden as in Keras.

        `jit_compile="auto"` (the default) takes the fastest compiled training step on every backend:
        `jax.jit` on JAX, XLA on TensorFlow (also on a CPU, where Keras's own "auto" leaves it off), and
        on PyTorch one `torch.compile`d graph for forward, loss, backward and optimizer update
        (`keras_transformer.models.compiled_step`), once the model has trained eagerly for
        `compiled_step.COMPILE_AFTER_SECONDS` (a short run never pays the compile). On PyTorch
        `evaluate` and `predict` compile their steps the same way (forward, loss and metrics; forward).
        `jit_compile=True` compiles from the first step; `jit_compile=False` (or `run_eagerly=True`)
        runs eagerly.
        """
        if optimizer == "auto":
            optimizer = keras.optimizers.AdamW(learning_rate=self.default_learning_rate, weight_decay=0.01)
        if loss == "auto":
            loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        if metrics == "auto":
            metrics = self.default_metrics()
        if weighted_metrics == "auto":
            weighted_metrics = self.default_weighted_metrics()
        if jit_compile not in ("auto", True, False):
            raise ValueError(f"`jit_compile` must be 'auto', True or False. Received: jit_compile={jit_compile!r}")
        torch_step = keras.config.backend() == "torch" and jit_compile is not False
        if keras.config.backend() == "tensorflow" and jit_compile == "auto" and not kwargs.get("run_eagerly"):
            jit_compile = all(layer.supports_jit for layer in self._flatten_layers())  # XLA, also without a GPU
        super().compile(
            optimizer=optimizer,
            loss=loss,
            metrics=metrics,
            weighted_metrics=weighted_metrics,
            jit_compile=False if torch_step else jit_compile,
            **kwargs,
        )
        if torch_step:  # a `.keras` file keeps the user's choice, not the False handed to Keras above
            self._compile_config.config["jit_compile"] = jit_compile
        # Keras's own torch.compile of `train_step` breaks it into many graphs (compiled_step.py says why).
        self._compiled_train_step = torch_step and not self.run_eagerly
        self._compile_after_seconds = 0.0 if jit_compile is True else compiled_step.COMPILE_AFTER_SECONDS

    def make_train_function(self, force=False):
        """On PyTorch, the task's compiled step (one graph) unless compiled with `jit_compile=False`."""
        if not self._compiled_step_applies(self.train_function, force):
            return super().make_train_function(force=force)
        self.train_function = CompiledTrainStep(self, warmup_seconds=self._compile_after_seconds)
        return self.train_function

    def make_test_function(self, force=False):
        """On PyTorch, `evaluate`'s step compiled as the training step is (forward, loss, metrics)."""
        if not self._compiled_step_applies(self.test_function, force):
            return super().make_test_function(force=force)
        self.test_function = CompiledTestStep(self, warmup_seconds=self._compile_after_seconds)
        return self.test_function

    def make_predict_function(self, force=False):
        """On PyTorch, `predict`'s forward pass compiled as one graph."""
        if not self._compiled_step_applies(self.predict_function, force):
            return super().make_predict_function(force=force)
        self.predict_function = CompiledPredictStep(self, warmup_seconds=self._compile_after_seconds)
        return self.predict_function

    def _compiled_step_applies(self, function, force):
        # steps_per_execution > 1: Keras raises its own error on PyTorch.
        return (
            getattr(self, "_compiled_train_step", False)
            and (function is None or force)
            and self.steps_per_execution == 1
        )

    def compile_from_config(self, config):
        """Recompile from a `.keras` file, so `keras.saving.load_model` restores the optimizer state too.

        Keras skips this for models that override `compile`; the saved config holds the
        resolved optimizer, loss and metrics, which `compile` accepts as they are.
        """
        self.compile(**keras.saving.deserialize_keras_object(config))
        if self.built:
            self.optimizer.build(self.trainable_variables)  # the file's optimizer variables load into these

    default_learning_rate = 1e-3

    def default_metrics(self):
        return None

    def default_weighted_metrics(self):
        return [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]

    # --- raw inputs -------------------------------------------------------

    def fit(self, x=None, y=None, batch_size=None, sample_weight=None, validation_data=None, **kwargs):
        if not self.compiled:
            self.compile()
        check_finite(y=y, sample_weight=sample_weight)
        x, y, sample_weight = self._preprocess(x, y, sample_weight, batch_size)
        if validation_data is not None and self._is_raw(validation_data):
            validation_data = self._preprocess(validation_data, None, None, batch_size)
        elif isinstance(validation_data, tuple) and validation_data and self._is_raw(validation_data[0]):
            validation_data = self._preprocess(*validation_data, batch_size=batch_size)
        elif isinstance(validation_data, tuple) and validation_data:
            check_inputs(self, *validation_data[:3], convert_tensors=True, context="In `validation_data`: ")
        return super().fit(
            x, y, batch_size=batch_size, sample_weight=sample_weight, validation_data=validation_data, **kwargs
        )

    def evaluate(self, x=None, y=None, batch_size=None, sample_weight=None, **kwargs):
        if not self.compiled:
            self.compile()
        check_finite(y=y, sample_weight=sample_weight)
        x, y, sample_weight = self._preprocess(x, y, sample_weight, batch_size)
        return super().evaluate(x, y, batch_size=batch_size, sample_weight=sample_weight, **kwargs)

    def predict(self, x, batch_size=None, **kwargs):
        x, _, _ = self._preprocess(x, None, None, batch_size, predict=True)
        return super().predict(x, batch_size=batch_size, **kwargs)

    def _is_raw(self, x):
        return self.preprocessor is not None and first_leaf_is_text(x)

    def _preprocessor_kwargs(self):
        """Extra keyword arguments for each preprocessor call (a classifier passes its num_classes)."""
        return {}

    def _preprocess(self, x, y=None, sample_weight=None, batch_size=None, predict=False):
        # Values are checked here, on the host, once per call (per batch for text datasets).
        if not self._is_raw(x):
            check_inputs(self, x, y, sample_weight, convert_tensors=True)
            return x, y, sample_weight

        def preprocess(batch_x, batch_y=None, batch_w=None):
            batch = self.preprocessor(batch_x, batch_y, batch_w, predict=predict, **self._preprocessor_kwargs())
            check_inputs(self, *batch)  # e.g. a tokenizer with more ids than the model
            return batch

        if is_dataset(x):
            return PreprocessedDataset(x, preprocess), None, None
        return preprocess(x, y, sample_weight)

    # --- presets ----------------------------------------------------------

    @classmethod
    def from_preset(cls, preset, load_weights=True, **kwargs):
        """Build the task from a registered preset name or a preset directory (or Hugging Face
        checkpoint). On a base class (`CausalLM`, `Seq2SeqLM`, ...) the preset picks the family:
        the task class it names, else the one subclass built on its backbone class.

        Example:
        >>> from keras_transformer.models import CausalLM
        >>> type(CausalLM.from_preset("llama_stdlib")).__name__  # the task class the preset names
        'LlamaCausalLM'
        """
        preprocessor = kwargs.get("preprocessor", "auto")
        if not (
            preprocessor is None
            or isinstance(preprocessor, Preprocessor)
            or (isinstance(preprocessor, str) and preprocessor == "auto")
        ):
            raise ValueError(f"`preprocessor` must be a Preprocessor, None or 'auto'. Received: {preprocessor!r}")
        if cls.backbone_cls is None:
            cls = _task_class_of(cls, preset, kwargs.get("allow_pickle", False))
        return presets.load_task(cls, preset, load_weights=load_weights, **kwargs)

    def save_to_preset(self, preset_dir, overwrite=True):
        """Write the backbone, the task head, the tokenizer and metadata to `preset_dir` (atomically)."""
        presets.save_task(self, preset_dir, overwrite=overwrite, quantization=quantization.quantization_mode(self))

    # --- checkpoints --------------------------------------------------------

    def save(self, filepath, overwrite=True, zipped=None, **kwargs):
        """Save a `.keras` file (config, weights and optimizer state) as `keras.Model.save`, atomically.

        The file is written under a temporary name and renamed at the end, so an interrupted
        save (crash, `KeyboardInterrupt`) keeps the previous file. This is the way to resume
        training exactly (`save_to_preset` keeps no optimizer state):

        >>> import os, tempfile
        >>> from keras_transformer.models import GPTCausalLM
        >>> lm, data = GPTCausalLM.from_preset("gpt_stdlib"), ["def add(a, b):\\n    return a + b\\n"] * 4
        >>> path = os.path.join(tempfile.mkdtemp(), "lm.keras")
        >>> history = lm.fit(data, epochs=1, verbose=0, callbacks=[keras.callbacks.ModelCheckpoint(path)])
        >>> lm = keras.saving.load_model(path)  # safe_mode: only registered classes, no lambdas
        >>> int(lm.optimizer.iterations)  # the optimizer state came back: `fit` continues as if never stopped
        1
        """
        if not _is_local(filepath, ".keras") or zipped is False or (not overwrite and os.path.exists(filepath)):
            return super().save(filepath, overwrite=overwrite, zipped=zipped, **kwargs)
        presets.atomic_file(filepath, lambda tmp: super(Task, self).save(tmp, zipped=zipped, **kwargs))

    def save_weights(self, filepath, overwrite=True, max_shard_size=None):
        """`keras.Model.save_weights` (optimizer state included), atomically for one `.weights.h5` file."""
        if (
            not _is_local(filepath, ".weights.h5")
            or max_shard_size is not None
            or (not overwrite and os.path.exists(filepath))
        ):
            return super().save_weights(filepath, overwrite=overwrite, max_shard_size=max_shard_size)
        presets.atomic_file(filepath, lambda tmp: super(Task, self).save_weights(tmp))

    def load_weights(self, filepath, skip_mismatch=False, **kwargs):
        """`keras.Model.load_weights`, checked first: a damaged `.weights.h5` file, or one whose shapes
        differ from this model, raises a ValueError naming it before any variable changes."""
        if not skip_mismatch and _is_local(filepath, ".weights.h5"):
            presets.check_weight_shapes(self, filepath)
        return super().load_weights(filepath, skip_mismatch=skip_mismatch, **kwargs)

    # --- quantized weights ------------------------------------------------

    def quantize(self, mode, config=None, **kwargs):
        """Quantize the Dense / EinsumDense weights of the backbone and head to `mode` ("int8" or "int4").

        Keras's own quantization (weights stored in 8 or 4 bits with per-channel scales); embedding
        tables stay float. `generate` rebuilds its compiled loop once afterwards, and
        `save_to_preset` / `from_preset` keep the quantized weights.

        Example:
        >>> from keras_transformer.models import GPTCausalLM
        >>> lm = GPTCausalLM.from_preset("gpt_stdlib")
        >>> lm.quantize("int8")
        >>> lm.generate("def add(", max_new_tokens=16)
        'def add(self, value):\\n...'
        """
        if kwargs:
            raise ValueError(f"Unexpected arguments for quantize: {sorted(kwargs)}")
        quantization.quantize(self, mode, super().quantize, config)

    # --- export -----------------------------------------------------------

    def export(self, filepath, format="onnx", overwrite=False, quantize=None, verbose="auto", **kwargs):
        """Export for deployment from any backend: an ONNX bundle or a TensorFlow SavedModel.

        Args:
            filepath: the directory to write.
            format: "onnx" (graphs, tokenizer and a Keras-free runner), "tf_saved_model", or
                "huggingface" (what `transformers`' `save_pretrained` writes, for vLLM / SGLang / TGI;
                `dtype=` and `max_shard_size=` apply), or "gguf" (one file for llama.cpp and Ollama;
                `gguf_type=` "f32", "f16", "bf16", "q8_0" or "q4_0" applies; see convert/gguf_export.py).
            overwrite: bool, replace an existing directory.
            quantize: None, "int8" or "int4" (ONNX only): the bundle's graphs with 8- or 4-bit weights.
                A model with LoRA enabled is exported merged.
            verbose: "auto" (for a model of 100M parameters or more), True or False: the export's phases as it
                goes, with a progress bar over the layers.

        See `keras_transformer.export.export_model`.
        """
        if kwargs and format not in ("huggingface", "gguf"):
            raise ValueError(f"Unexpected arguments for export: {sorted(kwargs)}")
        # The writers are built on the tasks, so the tasks cannot import them: keras_transformer/__init__.py
        # declares them by format, and the first lookup imports keras_transformer.export (see entry_points.py).
        formats = entry_points.names(entry_points.EXPORTERS)
        if format not in formats:
            raise ValueError(f"`format` must be one of {formats}. Received: format={format!r}")
        write = entry_points.load(entry_points.EXPORTERS, format)
        return write(self, filepath, format=format, overwrite=overwrite, quantize=quantize, verbose=verbose, **kwargs)

    # --- decoding ---------------------------------------------------------

    def decode_head(self):
        """The output projection as a (D, V) array for `call_with_cache(..., head=...)`, or None.

        None here (the task's own logits serve); tasks whose head is the tied token embedding
        return `transposed_embedding(backbone)`, which the compiled decoding loops make once per
        call, outside the loop, and pass to every step.
        """
        return None

    # --- config -----------------------------------------------------------

    def get_config(self):
        return {
            "backbone": keras.saving.serialize_keras_object(self.backbone),
            "preprocessor": presets.serialize_preprocessor(self.preprocessor),
            "name": self.name,
            "trainable": self.trainable,
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["backbone"] = presets.deserialize_backbone(config["backbone"])
        config["preprocessor"] = presets.deserialize_preprocessor(config.get("preprocessor"))
        return cls(**config)


def transposed_embedding(backbone):
    """The tied head's (V, D) token embedding as a (D, V) array in the compute dtype.

    XLA on CPU multiplies a few rows by the transposed (V, D) embedding much more slowly than by a
    (D, V) array (measured in benchmarks/RESULTS.md, "the tied output projection"), so a decoding
    loop makes this copy once instead of reading the transpose at every step.
    """
    embeddings = backbone.token_embedding.embeddings  # (V, D)
    return ops.cast(ops.transpose(embeddings), backbone.compute_dtype)  # -> (D, V)


def _is_local(filepath, suffix):
    return isinstance(filepath, (str, os.PathLike)) and "://" not in str(filepath) and str(filepath).endswith(suffix)


def _task_class_of(base, preset, allow_pickle=False):
    """The subclass of the task base `base` that `preset` holds (see `Task.from_preset`)."""
    _, config = presets.load_config(preset, allow_pickle=allow_pickle)
    name = (config.get("task") or {}).get("class_name")
    if name is not None:
        return presets.get_class(name, base)  # a ValueError unless a `base`
    backbone_cls = presets.get_class(config["backbone"]["class_name"], Backbone)
    found = subclasses_on(base, backbone_cls)
    if len(found) != 1:
        raise ValueError(
            f"Preset {str(preset)!r} holds a {backbone_cls.__name__} and names no task: "
            f"{[c.__name__ for c in found] or 'no'} {base.__name__} subclasses are built on it. "
            f"Call from_preset on the task class itself."
        )
    return found[0]


def subclasses_on(base, backbone_cls):
    """The subclasses of the task base `base` (at any depth) whose `backbone_cls` is `backbone_cls`, by name: the
    family's task of that kind (e.g. `subclasses_on(TextEmbedder, LlamaBackbone)` -> [LlamaTextEmbedder])."""

    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    return sorted({sub for sub in subclasses(base) if sub.backbone_cls is backbone_cls}, key=lambda c: c.__name__)
