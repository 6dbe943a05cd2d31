# %% [markdown]
# # 2. Train a GPT with `model.fit`, then generate with every sampler
#
# A tiny GPT-style decoder learns Python from the standard library's own source files (read from
# the running interpreter's installation: nothing is downloaded). We train a byte-level BPE
# tokenizer, train the model with plain `fit` on raw strings, plot the loss curves, and continue
# a few prompts with greedy search, pure sampling, top-k, top-p and beam search.
#
# A couple of minutes of training is enough to see Python-like text; this notebook trains for
# well under a minute, so expect indentation, keywords and `self.` rather than working code.
# Plots go to `$KT_EXAMPLES_OUT/02_train_gpt/` (default `examples/out/`).

# %%
import os
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import matplotlib.pyplot as plt
import numpy as np

import keras_transformer as kt
from keras_transformer.corpus import stdlib_texts

EXAMPLES = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()  # script | notebook
OUT = Path(os.environ.get("KT_EXAMPLES_OUT", EXAMPLES / "out")) / "02_train_gpt"
OUT.mkdir(parents=True, exist_ok=True)
keras.utils.set_random_seed(0)
print("backend:", keras.config.backend())


def save(fig, name):
    fig.savefig(OUT / name, dpi=80, bbox_inches="tight")
    print("wrote", OUT / name)


# %% [markdown]
# ## Data and tokenizer
#
# Files are split into train and held-out sets by a hash of their path, so no held-out file is
# ever seen in training. We cut the files into chunks of a few hundred characters; the
# preprocessor tokenizes each chunk and truncates it to the model's sequence length.

# %%
CHUNK_CHARS, SEQUENCE_LENGTH = 240, 64


def chunks(texts):
    return [text[i : i + CHUNK_CHARS] for text in texts for i in range(0, len(text) - CHUNK_CHARS, CHUNK_CHARS)]


train_texts = stdlib_texts("train", max_chars=1_300_000)
train_chunks = chunks(train_texts)
held_out_chunks = chunks(stdlib_texts("held_out", max_chars=40_000))[:128]
tokenizer = kt.tokenizers.BytePairTokenizer.train(train_texts, vocabulary_size=1024)
print(
    f"{len(train_chunks)} training chunks, {len(held_out_chunks)} held-out chunks; "
    f"vocabulary of {tokenizer.vocabulary_size} tokens"
)
print(tokenizer.tokenize("    def __init__(self, name):"))
print([tokenizer.id_to_token(i) for i in tokenizer.tokenize("    def __init__(self, name):")])

# %% [markdown]
# ## The model
#
# Backbone (token + learned position embeddings, pre-norm decoder blocks, final norm) and the
# causal-LM task, whose head reuses the token embedding. The task compiles by default with
# AdamW, a padding-aware cross-entropy, token accuracy and perplexity.

# %%
preprocessor = kt.models.GPTCausalLMPreprocessor(tokenizer, sequence_length=SEQUENCE_LENGTH, truncate=True)
backbone = kt.models.GPTBackbone(
    vocabulary_size=tokenizer.vocabulary_size,
    num_layers=2,
    num_heads=4,
    hidden_dim=64,
    intermediate_dim=256,
    max_sequence_length=128,
)
lm = kt.models.GPTCausalLM(backbone, preprocessor)
lm.compile(optimizer=keras.optimizers.AdamW(3e-3, weight_decay=0.01))
lm.summary()

# %% [markdown]
# ## Training with `fit` on raw strings
#
# Short "epochs" of 15 steps each, so that the history has one point per 15 steps and the
# held-out loss is measured as training goes.

# %%
start = time.perf_counter()
history = lm.fit(train_chunks, batch_size=32, epochs=10, steps_per_epoch=15, validation_data=held_out_chunks, verbose=2)
print(f"trained in {time.perf_counter() - start:.0f} s")
steps = 15 * np.arange(1, 11)

fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.5))
left.plot(steps, history.history["loss"], "o-", label="train (mean over the last 15 steps)")
left.plot(steps, history.history["val_loss"], "s-", label="held-out files")
left.set(xlabel="training step", ylabel="cross-entropy (nats / token)", title="Loss")
left.legend()
right.plot(steps, history.history["val_perplexity"], "s-", color="C1")
right.set(xlabel="training step", ylabel="perplexity", yscale="log", title="Held-out perplexity")
fig.tight_layout()
save(fig, "loss_curve.png")
assert history.history["val_loss"][-1] < history.history["val_loss"][0]

# %% [markdown]
# ## Generation with every sampler
#
# `generate` prefills the prompts once and then runs a compiled loop, one token per step, with a
# key/value cache. The sampler decides how each next token is picked:
#
# - greedy: the most likely token;
# - random: a draw from the softmax (temperature 1);
# - top-k / top-p: a draw from the k most likely tokens / the smallest set holding probability p;
# - beam: keeps the 4 most likely continuations and returns the best.

# %%
PROMPTS = ["def __init__(self", "import os\n", "    for line in"]
SAMPLERS = {
    "greedy": "greedy",
    "random": kt.samplers.RandomSampler(temperature=1.0, seed=0),
    "top-k 10": kt.samplers.RandomSampler(temperature=0.8, top_k=10, seed=0),
    "top-p 0.9": kt.samplers.RandomSampler(temperature=0.8, top_p=0.9, seed=0),
    "beam 4": kt.samplers.BeamSampler(num_beams=4),
}
results = {}
for name, sampler in SAMPLERS.items():
    start = time.perf_counter()
    results[name] = lm.generate(PROMPTS, max_new_tokens=24, sampler=sampler)
    print(f"{name:10} {time.perf_counter() - start:5.1f} s (the first call of a sampler compiles its loop)")

lines = []
for i, prompt in enumerate(PROMPTS):
    lines.append(f"=== prompt {prompt!r}")
    for name in SAMPLERS:
        lines.append(f"  {name:10} {results[name][i][len(prompt) :]!r}")
print("\n".join(lines))
(OUT / "samples.txt").write_text("\n".join(lines) + "\n")
assert all(text.startswith(prompt) for texts in results.values() for prompt, text in zip(PROMPTS, texts))
