"""Encoder-decoder generation speed: our T5Seq2SeqLM vs keras-hub's T5Seq2SeqLM of the same shape, in one run.

    KERAS_BACKEND=torch python benchmarks/generate_seq2seq.py [--repeats 3]

Both models: 4 encoder + 4 decoder layers, d 256, 4 heads of 64, d_ff 1024 with a gated gelu
(T5 v1.1), vocabulary 8000, no dropout, random weights (the same seed; the weights differ, the
work does not). Sources of 32 random tokens, 64 new tokens, stop tokens off, so both generate
exactly the same number of tokens. Each case is timed after a warm-up call that compiles it;
the two libraries' calls alternate for `--repeats` rounds: tokens/s is each one's best round,
the ratio the median of the rounds' ratios (keras-hub time / ours). Cases: greedy and beam
search (4 beams) at batch 1 and 8; tokens/s counts the tokens returned per input.
"""

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from timing import paired  # noqa: E402

VOCABULARY, LAYERS, HEADS, HIDDEN, HEAD_DIM, FF = 8000, 4, 4, 256, 64, 1024
SOURCE, NEW_TOKENS = 32, 64


class Ours:
    def __init__(self):
        import keras_transformer as kt

        keras.utils.set_random_seed(0)
        backbone = kt.models.T5Backbone(
            VOCABULARY,
            num_layers=LAYERS,
            num_heads=HEADS,
            hidden_dim=HIDDEN,
            intermediate_dim=FF,
            key_dim=HEAD_DIM,
            activation="gated-gelu",
            dropout=0.0,
            tie_embedding_weights=False,
        )
        self.lm = kt.models.T5Seq2SeqLM(backbone)
        self.kt = kt

    def generate(self, sources, beams):
        sampler = self.kt.samplers.GreedySampler() if beams == 1 else self.kt.samplers.BeamSampler(num_beams=beams)
        out = self.lm.generate(sources, max_new_tokens=NEW_TOKENS, sampler=sampler, stop_token_ids=None)
        assert out.shape == (len(sources), 1 + NEW_TOKENS), out.shape
        return out


class KerasHub:
    def __init__(self):
        import keras_hub

        keras.utils.set_random_seed(0)
        backbone = keras_hub.models.T5Backbone(
            VOCABULARY,
            num_layers=LAYERS,
            num_heads=HEADS,
            hidden_dim=HIDDEN,
            intermediate_dim=FF,
            key_value_dim=HEAD_DIM,
            activation="gelu",
            use_gated_activation=True,
            dropout=0.0,
            tie_embedding_weights=False,
        )
        self.lm = keras_hub.models.T5Seq2SeqLM(backbone, preprocessor=None)
        self.samplers = {1: keras_hub.samplers.GreedySampler(), 4: keras_hub.samplers.BeamSampler(num_beams=4)}

    def generate(self, sources, beams):
        # Without a preprocessor keras-hub fills every decoder position whose padding mask is False.
        batch = len(sources)
        decoder_ids = np.zeros((batch, 1 + NEW_TOKENS), "int32")  # the start token 0, then the slots
        decoder_mask = np.zeros_like(decoder_ids, dtype=bool)
        decoder_mask[:, 0] = True
        if getattr(self.lm, "_sampler_beams", None) != beams:
            self.lm.compile(sampler=self.samplers[beams])
            self.lm._sampler_beams = beams
        out = self.lm.generate(
            {
                "encoder_token_ids": sources,
                "encoder_padding_mask": np.ones_like(sources, dtype=bool),
                "decoder_token_ids": decoder_ids,
                "decoder_padding_mask": decoder_mask,
            },
            stop_token_ids=None,
        )
        assert np.asarray(out["decoder_token_ids"]).shape == (batch, 1 + NEW_TOKENS)
        return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    ours, hub = Ours(), KerasHub()
    print(
        f"T5 generate backend={keras.config.backend()}: source {SOURCE}, {NEW_TOKENS} new tokens, "
        f"{args.repeats} alternating rounds"
    )
    print(
        f"{'case':<16}{'ours tok/s':>12}{'keras-hub tok/s':>17}{'ratio':>8}"
        f"{'ours 1st call s':>17}{'hub 1st call s':>16}"
    )
    for beams in (1, 4):
        for batch in (1, 8):
            sources = np.random.default_rng(batch).integers(1, VOCABULARY, (batch, SOURCE)).astype("int32")
            firsts, best, per_round = paired(
                [lambda: ours.generate(sources, beams), lambda: hub.generate(sources, beams)], args.repeats
            )
            ratio = np.median([h / o for o, h in zip(*per_round)])  # keras-hub time / our time
            case = f"{'greedy' if beams == 1 else 'beam-4'} batch {batch}"
            print(
                f"{case:<16}{batch * NEW_TOKENS / best[0]:>12.0f}{batch * NEW_TOKENS / best[1]:>17.0f}{ratio:>8.2f}"
                f"{firsts[0]:>17.1f}{firsts[1]:>16.1f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
