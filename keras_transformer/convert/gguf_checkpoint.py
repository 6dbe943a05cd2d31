"""GGUF checkpoints (llama.cpp, Ollama, LM Studio) as presets: `from_preset("model.gguf")`,
`from_preset("hf://org/name/model.gguf")` and `keras-transformer convert model.gguf OUT` (`convert.convert`, which
takes a GGUF file wherever it takes a Hugging Face folder).

A GGUF file is read with llama.cpp's own `gguf` package (gguf_file.py), its metadata mapped onto the config.json
and its tensors onto the tensor names of the Hugging Face checkpoint it stands for (gguf_names.py), and that is
handed to the family's Hugging Face converter (hf_llama.py, hf_gpt2.py, hf_phi3.py, hf_gemma.py, hf_moe.py): the
same code builds the model and assigns its weights from either format. The tokenizer comes from the metadata
(gguf_tokenizer.py).

Everything that can be refused is refused before a model is built: the magic, the tensor table (types and
extents), the architecture, every `{arch}.` metadata key, every tensor's name, the tokenizer. Quantized tensors
(Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, the K-quants) are dequantized by gguf's numpy code, one tensor at a time, into
float32, then cast to the model's dtype (`from_preset(..., dtype="bfloat16")` keeps bfloat16 variables);
`from_preset(..., quantize="int4")` keeps Q4_0 projections 4-bit instead, in Keras's int4 layers (gguf_int4.py).

Example:
>>> # Writes a GGUF file, then reads it back.
>>> import tempfile
>>> from keras_transformer.models import CausalLM
>>> lm = CausalLM.from_preset("llama_stdlib")
>>> path = lm.export(f"{tempfile.mkdtemp()}/llama.gguf", format="gguf", gguf_type="f32")
>>> type(CausalLM.from_preset(path)).__name__
'LlamaCausalLM'
"""

from pathlib import Path

from keras_transformer.convert import gguf_int4, gguf_names, gguf_tokenizer, hugging_face
from keras_transformer.convert.checkpoint import CheckpointWeights
from keras_transformer.convert.gguf_file import open_checkpoint
from keras_transformer.convert.gguf_int4 import Int4Weights
from keras_transformer.models.quantization import one_gc_collect

SUFFIX = ".gguf"


class _GGUFWeights(CheckpointWeights):
    """A GGUF checkpoint's tensors under the Hugging Face names (`gguf_names.hf_tensors`), read when asked for, with
    CheckpointWeights' record of what was used."""

    def __init__(self, checkpoint, sources):
        super().__init__(checkpoint.path)
        self._arrays = sources  # {Hugging Face name: read()}

    def get(self, name):
        if name not in self._arrays:
            raise ValueError(f"The GGUF checkpoint {self.path} has no tensor for {name!r}, which the model needs.")
        self.used.add(name)
        return self._arrays[name]()


def convert_config(path, allow_pickle=False):
    """A GGUF file (or the first part of a split one) -> a preset config dict, as `hugging_face.convert_config`
    returns for a folder: {"family", "backbone", "task", "preprocessor", "tokenizer", "weights": callable(model)}.
    `allow_pickle` is accepted for the loader's sake and means nothing here (a GGUF holds no pickle)."""
    del allow_pickle
    checkpoint = open_checkpoint(path)
    hf_config = gguf_names.hf_config(checkpoint)
    sources = gguf_names.hf_tensors(checkpoint, hf_config)
    tokenizer = gguf_tokenizer.read_tokenizer(checkpoint)
    family = hugging_face.FAMILIES[hf_config["model_type"]]
    config = family.convert_config(hf_config, Path(path))
    if tokenizer is not None:
        config["tokenizer"] = tokenizer
        if "preprocessor" in config:
            config["preprocessor"]["config"]["add_start_token"] = gguf_tokenizer.adds_start_token(checkpoint)
    context = checkpoint.value(f"{checkpoint.architecture}.context_length")
    if context is not None and "preprocessor" in config:
        config["preprocessor"]["config"]["sequence_length"] = min(
            int(context), config["preprocessor"]["config"]["sequence_length"]
        )

    def load_weights(model, quantize=None):
        """Assign the file's weights to `model`; quantize="int4" keeps its Q4_0 projections 4-bit (gguf_int4.py)."""
        if quantize not in (None, *gguf_int4.MODES):
            raise ValueError(
                "A GGUF file keeps its Q4_0 weights 4-bit with quantize='int4' (Keras's int4, 32-wide blocks); other "
                "modes would requantize: load with quantize=None, then task.quantize(mode). "
                f"Received: quantize={quantize!r}"
            )
        with one_gc_collect():  # Keras collects garbage for every float kernel that quantizing drops
            weights = _GGUFWeights(checkpoint, sources) if quantize is None else Int4Weights(checkpoint, sources, model)
            family.load_weights(model, weights, hf_config)
        head = tuple(p for task_name, p in family.HEAD_TENSORS.items() if type(model).__name__ != task_name)
        weights.report(model, known_unused=family.KNOWN_UNUSED + head)

    load_weights.quantize_modes = gguf_int4.MODES  # what from_preset(quantize=...) may ask of this checkpoint
    config["weights"] = load_weights
    return config


__all__ = ["SUFFIX", "convert_config"]
