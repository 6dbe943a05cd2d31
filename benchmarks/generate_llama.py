"""Llama-style generation speed at the SmolLM2-135M shape: ours against keras-hub's LlamaCausalLM,
transformers' LlamaForCausalLM (same weights) and our ONNX bundle, in one run.

    KERAS_BACKEND=torch python benchmarks/generate_llama.py                 # ours vs keras-hub, this backend
    KERAS_BACKEND=torch python benchmarks/generate_llama.py --peer hf       # ours vs transformers (same weights)
    KERAS_BACKEND=torch python benchmarks/generate_llama.py --peer bundle   # ours vs our ONNX bundle (same weights)
    KERAS_BACKEND=torch python benchmarks/generate_llama.py --memory        # peak RSS, batch 8, 1024 positions

Shape: the `smollm2_135m` preset (30 layers, d 576, 9 heads, 3 key/value heads, SwiGLU 1536,
vocabulary 49152, rope_theta 1e5, tied head), random weights. Prompts of 16 random tokens, 128 new
tokens, no stop token (every row generates exactly 128); greedy and beam search (4 beams, length
penalty 1.0), batch 1. The calls alternate for `--repeats` rounds after a compiling call of each:
tokens/s is each one's best round, the ratio the median of the rounds' ratios (peer time / ours).

keras-hub's model has the same shape, with its own random weights (the work is the same). With
`--peer hf` ours is loaded from the `transformers` model's `save_pretrained` directory, and the
two must agree on the greedy tokens first. With `--peer bundle`, the bundle is exported from our
model and must return our greedy tokens.
"""

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from timing import paired  # noqa: E402

PRESET = "smollm2_135m"
PROMPT, NEW_TOKENS = 16, 128


def _config():
    from keras_transformer import presets

    _, config = presets.load_config(PRESET)
    return config["backbone"]["config"]


def keras_hub_backbone(c, dtype=None):
    """keras-hub's LlamaBackbone of our Llama config `c` (tied head), random weights."""
    import keras_hub

    return keras_hub.models.LlamaBackbone(
        vocabulary_size=c["vocabulary_size"],
        num_layers=c["num_layers"],
        num_query_heads=c["num_heads"],
        hidden_dim=c["hidden_dim"],
        intermediate_dim=c["intermediate_dim"],
        num_key_value_heads=c["num_key_value_heads"],
        rope_max_wavelength=c["rope_max_wavelength"],
        layer_norm_epsilon=c["norm_epsilon"],
        tie_word_embeddings=True,
        dtype=dtype,
    )


def transformers_config(c):
    """transformers' LlamaConfig of our Llama config `c` (tied head, token 0 for bos/eos/pad)."""
    import transformers

    return transformers.LlamaConfig(
        vocab_size=c["vocabulary_size"],
        hidden_size=c["hidden_dim"],
        intermediate_size=c["intermediate_dim"],
        num_hidden_layers=c["num_layers"],
        num_attention_heads=c["num_heads"],
        num_key_value_heads=c["num_key_value_heads"],
        max_position_embeddings=c["max_sequence_length"],
        rope_theta=c["rope_max_wavelength"],
        rms_norm_eps=c["norm_epsilon"],
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )


class Ours:
    name = "ours"

    def __init__(self, lm=None):
        import keras_transformer as kt

        keras.utils.set_random_seed(0)
        self.lm = lm or kt.models.LlamaCausalLM(kt.models.LlamaBackbone(**_config()))
        self.kt = kt

    def generate(self, prompts, new_tokens, beams):
        sampler = self.kt.samplers.GreedySampler() if beams == 1 else self.kt.samplers.BeamSampler(num_beams=beams)
        out = self.lm.generate(prompts, max_new_tokens=new_tokens, sampler=sampler, stop_token_ids=None)
        assert np.asarray(out).shape == (len(prompts), PROMPT + new_tokens)
        return np.asarray(out)


class KerasHub:
    name = "keras-hub"

    def __init__(self):
        import keras_hub

        keras.utils.set_random_seed(0)
        backbone = keras_hub_backbone(_config())
        self.lm = keras_hub.models.LlamaCausalLM(backbone, preprocessor=None)
        self.samplers = {1: keras_hub.samplers.GreedySampler(), 4: keras_hub.samplers.BeamSampler(num_beams=4)}
        self.beams = None

    def generate(self, prompts, new_tokens, beams):
        batch = len(prompts)
        token_ids = np.zeros((batch, PROMPT + new_tokens), "int32")
        token_ids[:, :PROMPT] = prompts
        mask = np.zeros_like(token_ids, dtype=bool)
        mask[:, :PROMPT] = True  # keras-hub fills every position whose mask is False
        if self.beams != beams:
            self.lm.compile(sampler=self.samplers[beams])
            self.beams = beams
        out = self.lm.generate({"token_ids": token_ids, "padding_mask": mask}, stop_token_ids=None)
        return np.asarray(out["token_ids"])


class HuggingFace:
    name = "transformers"

    def __init__(self, directory):
        import torch
        import transformers

        torch.manual_seed(0)
        self.model = transformers.LlamaForCausalLM(transformers_config(_config())).eval()
        self.model.save_pretrained(directory, safe_serialization=True)
        self.torch = torch

    def generate(self, prompts, new_tokens, beams):
        ids = self.torch.as_tensor(prompts)
        with self.torch.no_grad():
            out = self.model.generate(
                ids,
                attention_mask=self.torch.ones_like(ids),
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=False,
                num_beams=beams,
                length_penalty=1.0,
                early_stopping=False,
                use_cache=True,
                eos_token_id=None,
                pad_token_id=0,
            )
        return out.numpy()


class Bundle:
    name = "ONNX bundle"

    def __init__(self, lm, directory):
        from keras_transformer.bundle_runtime import load_bundle_runtime

        bundle = lm.export(Path(directory) / "bundle", format="onnx")
        self.generator = load_bundle_runtime(bundle).Generator(bundle)

    def generate(self, prompts, new_tokens, beams):
        options = {"sampler": "beam", "num_beams": beams} if beams > 1 else {"sampler": "greedy"}
        new = self.generator.generate_ids(np.asarray(prompts).tolist(), new_tokens, stop_token_ids=None, **options)
        return np.concatenate([np.asarray(prompts), np.asarray(new)], axis=1)  # prompt + new ids, as the others


def speed_table(peer_name, repeats):
    backend = keras.config.backend()
    with tempfile.TemporaryDirectory() as directory:
        if peer_name == "hf":
            peer = HuggingFace(directory)
            import keras_transformer as kt

            ours = Ours(kt.models.LlamaCausalLM.from_preset(directory, preprocessor=None))
        else:
            ours = Ours()
            peer = KerasHub() if peer_name == "keras-hub" else Bundle(ours.lm, directory)
        prompts = np.random.default_rng(1).integers(1, _config()["vocabulary_size"], (1, PROMPT))
        if peer_name != "keras-hub":  # same weights: the same greedy tokens first
            a, b = ours.generate(prompts, 16, 1), peer.generate(prompts, 16, 1)
            assert (a == b[:, : a.shape[1]]).all(), (a, b)
        print(
            f"{PRESET} shape, backend={backend}, ours vs {peer.name}: prompt {PROMPT}, {NEW_TOKENS} new tokens, "
            f"batch 1, {repeats} alternating rounds"
        )
        print(f"{'case':<10}{'ours tok/s':>12}{'peer tok/s':>12}{'ratio':>8}{'ours 1st s':>12}{'peer 1st s':>12}")
        for beams in (1, 4):
            firsts, best, per_round = paired(
                [lambda: ours.generate(prompts, NEW_TOKENS, beams), lambda: peer.generate(prompts, NEW_TOKENS, beams)],
                repeats,
            )
            ratio = np.median([p / o for o, p in zip(*per_round)])
            case = "greedy" if beams == 1 else "beam-4"
            print(
                f"{case:<10}{NEW_TOKENS / best[0]:>12.1f}{NEW_TOKENS / best[1]:>12.1f}{ratio:>8.2f}"
                f"{firsts[0]:>12.1f}{firsts[1]:>12.1f}",
                flush=True,
            )


def memory_child():
    import keras_transformer as kt

    lm = kt.models.LlamaCausalLM.from_preset(PRESET)
    prompts = np.random.default_rng(0).integers(1, 49152, (8, PROMPT))
    start = time.perf_counter()
    out = lm.generate(prompts, max_new_tokens=1024 - PROMPT, stop_token_ids=None)
    seconds = time.perf_counter() - start
    assert np.asarray(out).shape == (8, 1024)
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # kB -> GB
    print(
        f"memory backend={keras.config.backend():<10} {PRESET} batch 8, {PROMPT} + {1024 - PROMPT} tokens: "
        f"peak RSS {peak_gb:.2f} GB (target < 3 GB), {seconds:.0f} s incl. compilation",
        flush=True,
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer", choices=("keras-hub", "hf", "bundle"), default="keras-hub")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--memory", action="store_true")
    parser.add_argument("--memory-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child:
        memory_child()
    elif args.memory:
        subprocess.run([sys.executable, __file__, "--memory-child"], check=True)
    else:
        speed_table(args.peer, args.repeats)


if __name__ == "__main__":
    main()
