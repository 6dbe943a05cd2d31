"""Generation speed against Hugging Face transformers: the same GPT-2 weights, side by side, in one run.

    KERAS_BACKEND=jax python benchmarks/generate_hf.py [--repeats 5]

The peer is a random `transformers.GPT2LMHeadModel` of the shape of `benchmarks/generate.py`
(4 layers, d 256, 4 heads, d_ff 1024, vocabulary 8000, 1024 positions), in PyTorch on the CPU,
with its KV cache (`generate(use_cache=True)`, under `torch.no_grad()`). Ours is loaded from the
peer's `save_pretrained` directory with `GPTCausalLM.from_preset`, so both hold the same weights;
the script first checks that the two give the same next-token logits for the prompts (max abs
difference printed) and the same greedy tokens. Prompts of 16 random tokens, 128 new tokens,
no end token (both generate exactly 128 per row); greedy and beam search (4 beams, length
penalty 1.0) at batch 1 and 8. The two libraries' calls alternate for `--repeats` rounds after a
compiling call of each: tokens/s is each one's best round, the ratio the median of the rounds'
ratios (peer time / our time). The peer always runs PyTorch; ours runs on `KERAS_BACKEND`.
"""

import argparse
import os
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402

from generate import NEW_TOKENS, PROMPT, SHAPE, paired  # noqa: E402  (benchmarks/generate.py, beside this file)


class HuggingFace:
    name = "transformers"

    def __init__(self, directory):
        import torch
        import transformers

        torch.manual_seed(0)
        config = transformers.GPT2Config(
            vocab_size=SHAPE["vocabulary_size"],
            n_positions=1024,
            n_embd=SHAPE["hidden_dim"],
            n_layer=SHAPE["num_layers"],
            n_head=SHAPE["num_heads"],
            n_inner=SHAPE["intermediate_dim"],
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            bos_token_id=0,
            eos_token_id=0,
        )
        self.model = transformers.GPT2LMHeadModel(config).eval()
        self.model.save_pretrained(directory, safe_serialization=True)
        self.torch = torch

    def logits(self, prompts):
        with self.torch.no_grad():
            return self.model(self.torch.as_tensor(prompts)).logits[:, -1].numpy()  # (B, V)

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
        assert tuple(out.shape) == (len(prompts), PROMPT + new_tokens), out.shape
        return out.numpy()


class Ours:
    name = "ours"

    def __init__(self, directory):
        import keras_transformer as kt

        # the peer's checkpoint (no tokenizer: ids in, ids out), converted on load
        self.lm = kt.models.GPTCausalLM.from_preset(str(directory), preprocessor=None)
        self.kt = kt

    def logits(self, prompts):
        from keras import ops

        return ops.convert_to_numpy(self.lm({"token_ids": prompts, "padding_mask": np.ones_like(prompts, bool)}))[:, -1]

    def generate(self, prompts, new_tokens, beams):
        sampler = self.kt.samplers.GreedySampler() if beams == 1 else self.kt.samplers.BeamSampler(num_beams=beams)
        out = self.lm.generate(prompts, max_new_tokens=new_tokens, sampler=sampler, stop_token_ids=None)
        assert out.shape == (len(prompts), PROMPT + new_tokens), out.shape
        return out


def main():
    import keras

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        peer = HuggingFace(directory)
        ours = Ours(directory)
    prompts = np.random.default_rng(8).integers(1, SHAPE["vocabulary_size"], (8, PROMPT)).astype("int32")
    difference = np.max(np.abs(ours.logits(prompts) - peer.logits(prompts)))
    same = np.mean(ours.generate(prompts, 32, 1) == peer.generate(prompts, 32, 1))
    print(
        f"generate vs transformers backend={keras.config.backend()}: same weights, next-token logits max abs "
        f"difference {difference:.1e}, greedy tokens equal on {same:.1%} of 8 x 48 positions"
    )
    if difference > 1e-3:
        raise SystemExit("the two models disagree: not the same weights")
    print(f"prompt {PROMPT}, {NEW_TOKENS} new tokens, {args.repeats} alternating rounds")
    print(f"{'case':<16}{'ours tok/s':>12}{'transformers tok/s':>20}{'ratio':>8}")
    print(f"{'':<16}{'(best)':>12}{'(best)':>20}{'(median)':>8}")
    for beams in (1, 4):
        for batch in (1, 8):
            rows = np.random.default_rng(batch).integers(1, SHAPE["vocabulary_size"], (batch, PROMPT)).astype("int32")
            _, best, per_round = paired(
                [lambda: ours.generate(rows, NEW_TOKENS, beams), lambda: peer.generate(rows, NEW_TOKENS, beams)],
                args.repeats,
            )
            ratio = np.median([theirs / mine for mine, theirs in zip(*per_round)])
            case = f"{'greedy' if beams == 1 else 'beam-4'} batch {batch}"
            print(
                f"{case:<16}{batch * NEW_TOKENS / best[0]:>12.0f}{batch * NEW_TOKENS / best[1]:>20.0f}{ratio:>8.2f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
