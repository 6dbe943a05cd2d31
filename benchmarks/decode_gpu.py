"""Decoding speed at the SmolLM2-135M shape, every row of the GPU decoding table in one run, with the
memory-bandwidth floor beside each: ours, keras-hub and (on PyTorch) transformers, eager and compiled.

    KERAS_BACKEND=torch python benchmarks/decode_gpu.py            # the full table on this backend's device
    KERAS_BACKEND=jax python benchmarks/decode_gpu.py --shape tiny # a 2-layer model: a quick check on a CPU
    KERAS_BACKEND=jax python benchmarks/decode_gpu.py --peers ours --xla-command-buffers

`--xla-command-buffers` (JAX on a GPU): XLA records whole loops and branches as CUDA command buffers
(`--xla_gpu_enable_command_buffer` with WHILE and CONDITIONAL added to its default kinds), a variant only a GPU
can decide; the rows say so.

Rows (tokens/s over all rows; 16 random prompt tokens, `--new` new tokens, no stop token; greedy and
beam-4; batch 1 and 8; float32 and bfloat16):
- ours: `LlamaCausalLM` on this backend (PyTorch: the compiled step on CUDA, see decoding/compile.py);
- keras-hub: `LlamaCausalLM` of the same shape on this backend (its own random weights; the work is the same);
- PyTorch only: transformers' `LlamaForCausalLM` eager, and with `cache_implementation="static"`, under which its
  `generate` compiles the forward itself (`torch.compile`, CUDA graphs), batch 1.

The floor: one token reads every weight once, so a step takes at least weight bytes / memory bandwidth
(tokens/s <= bandwidth / bytes, times the rows at batch 8). The bandwidth comes from the device name
(H100 3.35 TB/s, H200 4.8 TB/s, A100 2.0 TB/s); elsewhere it is not printed. Each case runs once to
compile, then `--repeats` times; the best is reported. A case that fails prints its error and the
table goes on.
"""

import argparse
import functools
import os
import sys
import traceback
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
COMMAND_BUFFERS = "--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUDNN,CUSTOM_CALL,WHILE,CONDITIONAL"
if "--xla-command-buffers" in sys.argv:  # read by XLA when JAX starts, so before keras imports it
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {COMMAND_BUFFERS}".strip()

import keras  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from generate_llama import keras_hub_backbone, transformers_config  # noqa: E402
from timing import paired  # noqa: E402

PROMPT = 16
SHAPES = {
    "smollm2_135m": dict(
        vocabulary_size=49152,
        num_layers=30,
        num_heads=9,
        num_key_value_heads=3,
        hidden_dim=576,
        intermediate_dim=1536,
        rope_max_wavelength=100000.0,
        norm_epsilon=1e-5,
        max_sequence_length=2048,
    ),
    "tiny": dict(
        vocabulary_size=512,
        num_layers=2,
        num_heads=4,
        num_key_value_heads=2,
        hidden_dim=64,
        intermediate_dim=128,
        rope_max_wavelength=10000.0,
        norm_epsilon=1e-5,
        max_sequence_length=512,
    ),
}
BANDWIDTH = {"H200": 4.8e12, "H100": 3.35e12, "A100": 2.0e12}  # bytes/s, by device name


def device_name():
    backend = keras.config.backend()
    if backend == "torch":
        import torch

        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    if backend == "jax":
        import jax

        device = jax.devices()[0]
        return getattr(device, "device_kind", device.platform)
    import tensorflow as tf

    return "gpu" if tf.config.list_physical_devices("GPU") else "cpu"


class Ours:
    def __init__(self, shape, dtype):
        import keras_transformer as kt

        keras.utils.set_random_seed(0)
        config = {k: v for k, v in SHAPES[shape].items()}
        config["rope_max_wavelength"] = config.pop("rope_max_wavelength")
        self.lm = kt.models.LlamaCausalLM(kt.models.LlamaBackbone(**config, dtype=dtype))
        self.kt = kt
        self.parameters = self.lm.backbone.count_params()

    def generate(self, prompts, new, beams):
        sampler = "greedy" if beams == 1 else self.kt.samplers.BeamSampler(num_beams=beams)
        return self.lm.generate(prompts.tolist(), max_new_tokens=new, sampler=sampler, stop_token_ids=None)


class KerasHub:
    def __init__(self, shape, dtype):
        import keras_hub

        keras.utils.set_random_seed(0)
        backbone = keras_hub_backbone(SHAPES[shape], dtype)
        self.lm = keras_hub.models.LlamaCausalLM(backbone, preprocessor=None)
        self.samplers = {1: keras_hub.samplers.GreedySampler(), 4: keras_hub.samplers.BeamSampler(num_beams=4)}
        self.beams = None

    def generate(self, prompts, new, beams):
        token_ids = np.zeros((len(prompts), PROMPT + new), "int32")
        token_ids[:, :PROMPT] = prompts
        mask = np.zeros_like(token_ids, dtype=bool)
        mask[:, :PROMPT] = True  # keras-hub fills every position whose mask is False
        if self.beams != beams:
            self.lm.compile(sampler=self.samplers[beams])
            self.beams = beams
        return self.lm.generate({"token_ids": token_ids, "padding_mask": mask}, stop_token_ids=None)


class Transformers:
    def __init__(self, shape, dtype, static):
        import torch
        import transformers

        torch.manual_seed(0)
        device = "cuda" if torch.cuda.is_available() else "cpu"
        self.model = (
            transformers.LlamaForCausalLM(transformers_config(SHAPES[shape]))
            .to(device=device, dtype=getattr(torch, dtype))
            .eval()
        )
        self.static = static
        if static:
            # transformers compiles the forward itself when the cache is static (its `compile_config`, CUDA graphs
            # included) and marks each step for the graph trees: a forward compiled by hand here failed on the
            # H200 (a CUDA graph's output overwritten by the next call).
            self.model.generation_config.cache_implementation = "static"
        self.torch, self.device = torch, device

    def generate(self, prompts, new, beams):
        ids = self.torch.as_tensor(prompts, device=self.device)
        with self.torch.no_grad():
            return self.model.generate(
                ids,
                attention_mask=self.torch.ones_like(ids),
                max_new_tokens=new,
                min_new_tokens=new,
                do_sample=False,
                num_beams=beams,
                eos_token_id=None,
                pad_token_id=0,
            )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="smollm2_135m")
    parser.add_argument("--new", type=int, default=128, help="new tokens per row")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--peers", default="ours,keras-hub,transformers", help="comma-separated subset")
    parser.add_argument("--xla-command-buffers", action="store_true", help="JAX: loops as CUDA command buffers")
    args = parser.parse_args()
    backend, device = keras.config.backend(), device_name()
    bandwidth = next((b for name, b in BANDWIDTH.items() if name in device), None)
    print(f"backend {backend}, device {device}, shape {args.shape}, {PROMPT} prompt + {args.new} new tokens")
    print("| library | dtype | sampler | batch | tokens/s | floor tokens/s | % of floor |")
    print("|---|---|---|---:|---:|---:|---:|")
    rng = np.random.default_rng(0)
    peers = args.peers.split(",")
    cases = []
    for dtype in ("float32", "bfloat16"):
        if "ours" in peers:
            label = "ours, command buffers" if args.xla_command_buffers else "ours"
            cases.append((label, dtype, lambda d=dtype: Ours(args.shape, d), [(1, 1), (1, 8), (4, 1), (4, 8)]))
        if "keras-hub" in peers:
            # keras-hub's PyTorch generation runs eagerly (about 20 s a call at this shape on an H200): greedy at
            # batch 1 only there, to stay inside one device call.
            runs = [(1, 1)] if backend == "torch" else [(1, 1), (1, 8), (4, 1), (4, 8)]
            cases.append(("keras-hub", dtype, lambda d=dtype: KerasHub(args.shape, d), runs))
        if "transformers" in peers and backend == "torch":
            cases.append(("transformers eager", dtype, lambda d=dtype: Transformers(args.shape, d, False), [(1, 1)]))
            cases.append(
                ("transformers static compiled", dtype, lambda d=dtype: Transformers(args.shape, d, True), [(1, 1)])
            )
    parameters = None
    failed = False
    for name, dtype, build, runs in cases:
        try:
            model = build()
        except Exception:  # noqa: BLE001 - a peer that cannot run here is reported, the table goes on
            print(f"| {name} | {dtype} | failed to build: {traceback.format_exc(limit=1).splitlines()[-1]} |")
            failed = True
            continue
        if parameters is None and name.startswith("ours"):
            parameters = model.parameters
        for beams, batch in runs:
            prompts = rng.integers(1, SHAPES[args.shape]["vocabulary_size"], (batch, PROMPT)).astype("int32")
            try:
                run = functools.partial(model.generate, prompts, args.new, beams)
                seconds = paired([run], args.repeats)[1][0]
            except Exception:  # noqa: BLE001
                print(
                    f"| {name} | {dtype} | {'greedy' if beams == 1 else 'beam-4'} | {batch} | failed: "
                    f"{traceback.format_exc(limit=1).splitlines()[-1]} | | |"
                )
                failed = True
                continue
            rate = batch * args.new / seconds
            floor = ""
            share = ""
            if bandwidth and parameters:
                weight_bytes = parameters * (4 if dtype == "float32" else 2)
                floor_rate = bandwidth / weight_bytes * batch  # one read of the weights per step, every row
                floor, share = f"{floor_rate:,.0f}", f"{100 * rate / floor_rate:.1f}%"
            sampler = "greedy" if beams == 1 else "beam-4"
            print(f"| {name} | {dtype} | {sampler} | {batch} | {rate:,.0f} | {floor} | {share} |", flush=True)
        del model
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
