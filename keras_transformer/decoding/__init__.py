"""The decoding engine: `generate`'s inputs and outputs, the one loop every backend compiles, and how it runs.

One job per module:
- `generate.py`: `generate`, from its checked `GenerateOptions` (`generate_options.py`) and inputs
  (`generate_inputs.py`) to the typed `DecodeInputs`, and back to the caller's form (`generate_outputs.py`);
- `generation_config.py`: `GenerationConfig`, a model's own defaults (its checkpoint's generation_config.json);
- `decode_options.py`: `DecodeOptions`, the frozen static settings (also the compile key);
- `decode_inputs.py`: `PrefillInputs`, `LoopInputs`, `DecodeInputs`, a call's typed tensors;
- `loop_state.py`: the loop's typed state; `step_context.py`: what a step reads besides it (`StepContext`);
- `decode_loop.py`: prefill, start, one step and the whole loop, written once for every backend;
- `cache_schedule.py`: the widths the key/value cache grows through, and its layout in the loop;
- `compile.py`: the one backend switch (how the loop or a step is compiled, and on PyTorch which kernels run);
- `decode.py`: runs the compiled prefill and loop on a call's inputs.

The engine imports the samplers (`keras_transformer.samplers`) and the kernels (`keras_transformer.kernels`),
never the reverse. `trace_prepare` / `trace_run` are the loop for callers that trace it themselves (the
SavedModel export).
"""

from keras_transformer.decoding.cache_schedule import cache_widths
from keras_transformer.decoding.decode_inputs import DecodeInputs, LoopInputs, PrefillInputs
from keras_transformer.decoding.decode_loop import trace_prepare, trace_run
from keras_transformer.decoding.decode_options import DecodeOptions
from keras_transformer.decoding.generate import LENGTH_BUCKET, PREFILL_BUCKET, generate, generate_with
from keras_transformer.decoding.generate_options import GenerateOptions
from keras_transformer.decoding.generation_config import GenerationConfig

__all__ = [
    "DecodeInputs",
    "DecodeOptions",
    "GenerateOptions",
    "GenerationConfig",
    "LENGTH_BUCKET",
    "LoopInputs",
    "PREFILL_BUCKET",
    "PrefillInputs",
    "cache_widths",
    "generate",
    "generate_with",
    "trace_prepare",
    "trace_run",
]
