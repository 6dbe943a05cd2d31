"""The hand-over to the TensorFlow export child (keras_transformer/export/handover.py): the child rebuilds the task
with exactly the parent's weights, with no random values drawn first.

Its memory is bounded in tests/export/test_export_memory.py (the child's own peak).
"""

import hashlib

import numpy as np
import pytest

from keras_transformer.export import handover, load_preset_task
from keras_transformer.models import GPTBackbone, GPTCausalLM, LlamaBackbone, LlamaCausalLM
from tests.export.helpers import randomize, run_python, tiny_llama, to_numpy

# Run under TensorFlow as `python -c REBUILD ARGS...` (what `hand_over` returned): prints the rebuilt task's weights,
# hashed.
REBUILD = """
import hashlib, json, sys
from keras_transformer.export import handover, load_preset_task
preset, weights = sys.argv[1], sys.argv[3]
task = handover.build_with_weights(lambda: load_preset_task(preset, load_weights=False), weights)
print(json.dumps({
    "hashes": [hashlib.sha256(v.numpy().tobytes()).hexdigest() for v in task.weights],
    "paths": [v.path for v in task.weights],
    "preprocessor": type(task.preprocessor).__name__,
}))
"""


def _hashes(task):
    return [hashlib.sha256(to_numpy(v).tobytes()).hexdigest() for v in task.weights]


def test_a_tensorflow_process_rebuilds_the_same_task(tmp_path):
    """Written on the backend under test, read under TensorFlow: every weight bit for bit, the preprocessor too."""
    lm = tiny_llama()
    args = handover.hand_over(lm, tmp_path)
    assert args[1:] == ["--weights", str(tmp_path / "weights")]
    assert not list((tmp_path / "preset").glob("*.weights.h5"))  # the preset holds no weights
    rebuilt = run_python(REBUILD, *args, env={"KERAS_BACKEND": "tensorflow"})
    assert rebuilt["hashes"] == _hashes(lm)
    assert rebuilt["paths"] == [v.path for v in lm.weights]
    assert rebuilt["preprocessor"] == type(lm.preprocessor).__name__


def test_bfloat16_weights_and_the_forward_pass_come_back_exactly(tmp_path):
    """In this process (any backend builds this way): a bfloat16 task's weights, and the logits of the rebuilt task."""
    backbone = LlamaBackbone(61, num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16, dtype="bfloat16")
    lm = randomize(LlamaCausalLM(backbone), seed=3)
    args = handover.hand_over(lm, tmp_path)
    rebuilt = handover.build_with_weights(lambda: load_preset_task(args[0], load_weights=False), args[2])
    assert [v.dtype for v in rebuilt.weights] == [v.dtype for v in lm.weights]
    assert "bfloat16" in {v.dtype for v in rebuilt.weights}
    assert _hashes(rebuilt) == _hashes(lm)
    ids = {"token_ids": np.array([[1, 5, 7, 9]], "int32"), "padding_mask": np.ones((1, 4), bool)}
    np.testing.assert_array_equal(to_numpy(rebuilt(ids)), to_numpy(lm(ids)))


def test_weights_of_another_model_are_a_value_error(tmp_path):
    small = GPTCausalLM(GPTBackbone(50, num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16))
    handover.write_weights(small, tmp_path)

    def other():
        return GPTCausalLM(GPTBackbone(50, num_layers=2, num_heads=2, hidden_dim=8, intermediate_dim=16))

    with pytest.raises(ValueError, match=r"has \d+ weights, and .*weights.json lists \d+; they first differ at weight"):
        handover.build_with_weights(other, tmp_path)


def test_a_quantized_task_goes_as_a_whole_preset(tmp_path):
    """Its layers are quantized after they are built, from float weights: the child loads the preset as saved."""
    lm = randomize(GPTCausalLM(GPTBackbone(50, num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16)))
    lm.quantize("int8")
    args = handover.hand_over(lm, tmp_path)
    assert args == [str(tmp_path / "preset")]
    assert _hashes(load_preset_task(args[0])) == _hashes(lm)
