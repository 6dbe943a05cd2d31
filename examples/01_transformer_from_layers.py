# %% [markdown]
# # 1. A Transformer from the layers
#
# The encoder-decoder of "Attention Is All You Need", assembled from `keras_transformer.layers`:
# token embedding + sinusoidal positions, one `TransformerEncoderBlock`, one
# `TransformerDecoderBlock` with cross-attention, and a linear head. We look at
#
# 1. the sinusoidal positional-encoding table,
# 2. the attention weights of the model after a short training run on a task whose attention
#    pattern we can predict (reversing a string of digits),
# 3. the same attention layer with and without masks, side by side,
# 4. the attention of `gpt_stdlib`, a GPT trained on Python source, on a line of Python.
#
# Runs on TensorFlow, JAX or PyTorch (`KERAS_BACKEND`) in well under a minute on a CPU. Plots are
# written to `$KT_EXAMPLES_OUT/01_transformer_from_layers/` (default `examples/out/`).

# %%
import os
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import matplotlib.pyplot as plt
import numpy as np
from keras import ops

from keras_transformer.layers import PositionalEmbedding, TransformerDecoderBlock, TransformerEncoderBlock

EXAMPLES = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()  # script | notebook
OUT = Path(os.environ.get("KT_EXAMPLES_OUT", EXAMPLES / "out")) / "01_transformer_from_layers"
OUT.mkdir(parents=True, exist_ok=True)
keras.utils.set_random_seed(0)
print("backend:", keras.config.backend())


def save(fig, name):
    fig.savefig(OUT / name, dpi=80, bbox_inches="tight")
    print("wrote", OUT / name)


# %% [markdown]
# ## The sinusoidal positional encoding
#
# PE(pos, 2i) = sin(pos / 10000^(2i/D)), PE(pos, 2i+1) = cos(pos / 10000^(2i/D)). The layer adds
# no weights; we read its table by calling it on zeros of shape (1, positions, D), and check it
# against the formula written in numpy.

# %%
positions, width = 128, 64
table = ops.convert_to_numpy(PositionalEmbedding(positions, "sinusoidal")(np.zeros((1, positions, width))))[0]

pos = np.arange(positions)[:, None]
two_i = np.arange(width) // 2 * 2
angles = pos / 10000.0 ** (two_i / width)
expected = np.where(np.arange(width) % 2 == 0, np.sin(angles), np.cos(angles))
print("max |layer - formula| =", np.abs(table - expected).max())
assert np.allclose(table, expected, atol=1e-6)

fig, ax = plt.subplots(figsize=(7, 4))
image = ax.imshow(table, cmap="RdBu", aspect="auto", vmin=-1, vmax=1, interpolation="nearest")
ax.set(xlabel="feature (even: sin, odd: cos)", ylabel="position", title="Sinusoidal positional encoding")
fig.colorbar(image, ax=ax)
save(fig, "positional_encoding.png")

# %% [markdown]
# ## A tiny encoder-decoder
#
# One encoder block (bidirectional self-attention), one decoder block (causal self-attention,
# then cross-attention over the encoder output), a shared token embedding scaled by sqrt(D) as in
# the paper, and a linear head. `call` can also return every attention map
# (`return_attention_scores=True` on the blocks).

# %%
DIGITS, LENGTH, START = 10, 8, 10  # tokens 0..9 are digits, 10 starts the decoder


class TinyTransformer(keras.Model):
    def __init__(self, vocabulary_size, hidden_dim=32, num_heads=2, intermediate_dim=64, **kwargs):
        super().__init__(**kwargs)
        self.hidden_dim = hidden_dim
        self.embedding = keras.layers.Embedding(vocabulary_size, hidden_dim)
        self.positions = PositionalEmbedding(64, "sinusoidal")
        # Built here, eagerly: Keras builds a subclassed model's layers while tracing its first call,
        # and under JAX the sinusoid table computed by `build` must not be created inside a trace.
        self.positions.build((None, None, hidden_dim))
        self.encoder = TransformerEncoderBlock(num_heads, intermediate_dim)
        self.decoder = TransformerDecoderBlock(num_heads, intermediate_dim, use_cross_attention=True)
        self.head = keras.layers.Dense(vocabulary_size)

    def embed(self, ids):
        x = self.embedding(ids) * self.hidden_dim**0.5  # (B, T) -> (B, T, D)
        return x + self.positions(x)

    def call(self, inputs, return_attention_scores=False):
        encoded = self.encoder(self.embed(inputs["source"]), return_attention_scores=return_attention_scores)
        if return_attention_scores:
            encoded, encoder_scores = encoded
        decoded = self.decoder(
            self.embed(inputs["target_in"]), encoder_outputs=encoded, return_attention_scores=return_attention_scores
        )
        if return_attention_scores:
            decoded, decoder_scores = decoded  # {"self_attention": ..., "cross_attention": ...}
            return self.head(decoded), {"encoder": encoder_scores, **decoder_scores}
        return self.head(decoded)  # (B, T, V) logits


def reversal_batch(rng, count):
    """Sources are random digit strings; the decoder reads [START] + target[:-1] and predicts the target."""
    source = rng.integers(0, DIGITS, (count, LENGTH))
    target = source[:, ::-1]
    target_in = np.concatenate([np.full((count, 1), START), target[:, :-1]], axis=1)
    return {"source": source.astype("int32"), "target_in": target_in.astype("int32")}, target.astype("int32")


model = TinyTransformer(DIGITS + 1)
x_train, y_train = reversal_batch(np.random.default_rng(0), 4096)
x_test, y_test = reversal_batch(np.random.default_rng(1), 500)
model.compile(
    optimizer=keras.optimizers.Adam(3e-3),
    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    metrics=["accuracy"],
)
model.fit(x_train, y_train, batch_size=64, epochs=2, verbose=2)
predictions = np.argmax(ops.convert_to_numpy(model(x_test)), axis=-1)  # one eager call: nothing to compile
print(
    f"held-out: {np.mean(predictions == y_test):.1%} of digits and "
    f"{np.mean(np.all(predictions == y_test, axis=1)):.1%} of whole strings reversed (teacher forcing)"
)

# %% [markdown]
# ## What the trained model attends to
#
# Decoder position i must output source digit LENGTH - 1 - i, so its cross-attention should
# concentrate on the anti-diagonal. The decoder's self-attention is causal (nothing above the
# diagonal); the encoder's is not masked at all.

# %%
example = {key: value[:1] for key, value in x_test.items()}
_, scores = model(example, return_attention_scores=True)
scores = {name: ops.convert_to_numpy(value)[0] for name, value in scores.items()}  # each (H, T, S)
for name, value in scores.items():
    print(f"{name:16} {value.shape}  rows sum to 1: {np.allclose(value.sum(-1), 1, atol=1e-5)}")
cross = scores["cross_attention"].mean(0)  # (T, S), averaged over heads
anti_diagonal = cross[np.arange(LENGTH), LENGTH - 1 - np.arange(LENGTH)].mean()
print(f"mean cross-attention weight on the mirrored source position: {anti_diagonal:.2f} (uniform: {1 / LENGTH:.2f})")

source_digits = [str(d) for d in example["source"][0]]
target_digits = ["<s>"] + [str(d) for d in example["target_in"][0, 1:]]
panels = [
    ("encoder", "encoder self-attention", source_digits, source_digits),
    ("self_attention", "decoder self-attention (causal)", target_digits, target_digits),
    ("cross_attention", "decoder cross-attention", target_digits, source_digits),
]
heads = scores["encoder"].shape[0]
fig, axes = plt.subplots(heads, 3, figsize=(10, 3.2 * heads))
for head in range(heads):
    for col, (name, title, queries, keys) in enumerate(panels):
        ax = axes[head, col]
        ax.imshow(scores[name][head], cmap="viridis", vmin=0, vmax=1)
        ax.set_xticks(range(len(keys)), keys)
        ax.set_yticks(range(len(queries)), queries)
        ax.set_title(f"{title}\nhead {head}", fontsize=9)
        ax.set_xlabel("key")
        ax.set_ylabel("query")
fig.tight_layout()
save(fig, "attention_weights.png")

# %% [markdown]
# ## Masked vs unmasked attention
#
# The same layer (the trained decoder's self-attention) on the same inputs, three ways: no mask;
# a causal mask (query i sees keys 0..i); and a padding mask that hides the last three keys, as
# for a right-padded sequence. Masked entries get probability exactly 0.

# %%
attention = model.decoder.self_attention
inputs = model.embed(example["source"])  # (1, T, D)
padding_mask = np.arange(LENGTH)[None, :] < LENGTH - 3  # (1, S): True for the real tokens
variants = {
    "no mask": attention(inputs, return_attention_scores=True)[1],
    "causal mask": attention(inputs, use_causal_mask=True, return_attention_scores=True)[1],
    "padding mask (last 3 keys)": attention(inputs, attention_mask=padding_mask, return_attention_scores=True)[1],
}
variants = {name: ops.convert_to_numpy(value)[0, 0] for name, value in variants.items()}  # head 0: (T, S)
assert np.all(np.triu(variants["causal mask"], k=1) == 0)
assert np.all(variants["padding mask (last 3 keys)"][:, LENGTH - 3 :] == 0)

fig, axes = plt.subplots(1, 3, figsize=(11, 3.6))
for ax, (name, weights) in zip(axes, variants.items()):
    ax.imshow(weights, cmap="viridis", vmin=0, vmax=1)
    ax.set(title=name, xlabel="key", ylabel="query")
fig.tight_layout()
save(fig, "masked_vs_unmasked.png")

# %% [markdown]
# ## A trained language model's attention
#
# The same blocks make up `gpt_stdlib`, a small GPT trained on the Python standard library (2
# layers of 4 heads; `models/gpt_stdlib/README.md`). We run a line of Python through its blocks one
# by one, asking each for its attention probabilities, and check that the walk gives the
# backbone's own output. Each head learns its own pattern: some look at the previous token,
# some at the token that opened the current construct.

# %%
import keras_transformer as kt

lm = kt.models.GPTCausalLM.from_preset("gpt_stdlib")
backbone, tokenizer = lm.backbone, lm.preprocessor.tokenizer
line = "for name in names:\n    print(name)"
ids = np.array(lm.preprocessor.generate_preprocess([line]), "int32")  # (1, T): [start] + the line's tokens
x = backbone.token_embedding(ids)  # (1, T) -> (1, T, D)
x = x + backbone.position_embedding(x)
maps = []
for block in backbone.transformer_layers:
    x, block_scores = block(x, return_attention_scores=True)  # causal self-attention
    maps.append(ops.convert_to_numpy(block_scores["self_attention"])[0])  # (H, T, T)
hidden = backbone({"token_ids": ids, "padding_mask": np.ones_like(ids, bool)})
assert np.allclose(ops.convert_to_numpy(backbone.layer_norm(x)), ops.convert_to_numpy(hidden), atol=1e-4)
assert all(np.all(np.triu(m, k=1) == 0) and np.allclose(m.sum(-1), 1, atol=1e-5) for m in maps)

# Byte-level BPE marks a leading space with "Ġ" and a newline with "Ċ": shown as "·" and "\n".
labels = ["<s>"] + [tokenizer.id_to_token(int(i)).replace("Ġ", "·").replace("Ċ", "\\n") for i in ids[0, 1:]]
print(labels)
fig, axes = plt.subplots(len(maps), maps[0].shape[0], figsize=(12, 6.4))
for layer, layer_maps in enumerate(maps):
    for head, weights in enumerate(layer_maps):
        ax = axes[layer, head]
        ax.imshow(weights, cmap="viridis", vmin=0, vmax=1)
        ax.set_xticks(range(len(labels)), labels, rotation=90, fontsize=7)
        ax.set_yticks(range(len(labels)), labels, fontsize=7)
        ax.set_title(f"layer {layer + 1}, head {head + 1}", fontsize=9)
fig.suptitle(f"gpt_stdlib: who attends to whom in {line!r} (rows: queries, columns: keys)")
fig.tight_layout()
save(fig, "gpt_stdlib_attention.png")
