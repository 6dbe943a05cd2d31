# %% [markdown]
# # 9. Fine-tune with LoRA, quantize to int8 / int4, ship small ONNX bundles
#
# We start from `gpt_stdlib`, a small GPT trained on the Python standard library, and adapt it to
# another code base, Keras's own source (installed with Keras: nothing is downloaded), with LoRA:
# the pretrained weights stay frozen and each attention query and value projection learns a
# low-rank update (kernel + A @ B). The update is a file of a few kilobytes; merged into the
# kernels it costs nothing at run time. Then we quantize the merged model's weights to 8 and 4
# bits, in Keras (`lm.quantize`) and in exported ONNX bundles (what `lm.export(..., quantize=...)`
# writes), and compare size, generation speed and held-out perplexity.
#
# Plots go to `$KT_EXAMPLES_OUT/09_lora_quantize/` (default `examples/out/`).

# %%
import hashlib
import importlib.util
import os
import random
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import matplotlib.pyplot as plt
import numpy as np
import onnxruntime

import keras_transformer as kt

EXAMPLES = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()  # script | notebook
OUT = Path(os.environ.get("KT_EXAMPLES_OUT", EXAMPLES / "out")) / "09_lora_quantize"
OUT.mkdir(parents=True, exist_ok=True)
keras.utils.set_random_seed(0)
print("backend:", keras.config.backend())


def save(fig, name):
    fig.savefig(OUT / name, dpi=80, bbox_inches="tight")
    print("wrote", OUT / name)


# %% [markdown]
# ## The new domain: Keras's source code
#
# The `.py` files of the installed Keras (tests left out), split into training and held-out files
# by a hash of their path, then tokenized with the preset's tokenizer and packed into windows of
# 128 tokens (`packing=True`: files are concatenated and cut, so every token counts).

# %%
STEPS, BATCH_SIZE, HELD_OUT_WINDOWS = 48, 8, 32
source = Path(keras.__file__).parent / "src"
files = sorted(path for path in source.rglob("*.py") if not path.name.endswith("_test.py"))
random.Random(0).shuffle(files)


def is_held_out(path):
    return hashlib.sha256(str(path.relative_to(source)).encode()).digest()[0] < 256 * 0.1


def read(paths, max_chars):
    texts = []
    for path in paths:
        if max_chars is not None and sum(map(len, texts)) >= max_chars:
            break
        texts.append(path.read_text(encoding="utf-8"))
    return [text for text in texts if text.strip()]


def windows(texts, count, seed):
    """(x, y, sample_weight) of `count` packed windows of `texts`, drawn with `seed` from all of them."""
    x, y, w = lm.preprocessor(texts)  # x: a dict of (N, T) arrays
    rows = np.random.default_rng(seed).permutation(len(y))[:count]
    assert len(rows) == count, f"only {len(y)} windows"
    return {name: value[rows] for name, value in x.items()}, y[rows], w[rows]


lm = kt.models.GPTCausalLM.from_preset("gpt_stdlib")
lm.preprocessor.packing = True
train_texts = read([f for f in files if not is_held_out(f)], 400_000)
train_x, train_y, train_w = windows(train_texts, STEPS * BATCH_SIZE, seed=0)
held_out = windows(read([f for f in files if is_held_out(f)], None), HELD_OUT_WINDOWS, seed=1)  # all held-out files
print(
    f"Keras {keras.__version__} source: {len(train_y)} training windows and {len(held_out[1])} held-out windows "
    f"of {lm.preprocessor.sequence_length} tokens"
)

# %% [markdown]
# ## Held-out perplexity, one function for every model
#
# exp(mean cross-entropy) of the next token over the held-out windows, from the logits of any
# forward pass: a Keras model, or the `prefill.onnx` graph of a bundle in ONNX Runtime.


# %%
def perplexity(logits_of, data=held_out, batch_size=8):
    """`logits_of(token_ids (B, T), padding_mask (B, T))` -> (B, T, V) logits; the perplexity on `data`."""
    x, y, w = data
    total, count = 0.0, 0.0
    for i in range(0, len(y), batch_size):
        logits = np.asarray(logits_of(x["token_ids"][i : i + batch_size], x["padding_mask"][i : i + batch_size]))
        logits = logits - logits.max(-1, keepdims=True)
        log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))  # (B, T, V)
        nll = -np.take_along_axis(log_probs, y[i : i + batch_size, :, None], -1)[..., 0]  # (B, T)
        total += float((nll * w[i : i + batch_size]).sum())
        count += float(w[i : i + batch_size].sum())
    return float(np.exp(total / count))


def keras_logits(model):
    return lambda ids, mask: keras.ops.convert_to_numpy(model({"token_ids": ids, "padding_mask": mask}))


def onnx_logits(bundle):
    session = onnxruntime.InferenceSession(str(bundle / "prefill.onnx"), providers=["CPUExecutionProvider"])
    return lambda ids, mask: session.run(
        ["logits"], {"input_ids": ids.astype("int64"), "attention_mask": mask.astype("int64")}
    )[0]


ppl = {"gpt_stdlib": perplexity(keras_logits(lm))}
print(f"gpt_stdlib as trained, on held-out Keras source: perplexity {ppl['gpt_stdlib']:.1f}")

# %% [markdown]
# ## LoRA: only the low-rank factors train
#
# `enable_lora(rank)` adds factors A (D, r) and B (r, ...) to each attention query and value
# projection; `target_names` chooses others: here every projection of the blocks (attention and
# feed-forward), which adapts much further in a few dozen steps than query and value alone. Every
# other weight is frozen: embeddings, norms, biases and the original kernels. B starts at zero,
# so the model starts exactly as the preset.

# %%
RANK, TARGETS = 8, ["query", "value", "key", "attention_output", "intermediate", "output"]
frozen_before = {v.path: keras.ops.convert_to_numpy(v) for v in lm.weights}
lm.backbone.enable_lora(RANK, target_names=TARGETS)
trainable = lm.trainable_weights
lora_parameters = sum(int(np.prod(v.shape)) for v in trainable)
print(
    f"{len(trainable)} trainable tensors, {lora_parameters:,} parameters "
    f"({lora_parameters / lm.count_params():.1%} of the model):",
    sorted({v.path.split("/")[-1] for v in trainable}),
)
assert trainable and all(v.path.endswith(("lora_kernel_a", "lora_kernel_b")) for v in trainable)

lm.compile(optimizer=keras.optimizers.AdamW(5e-3, weight_decay=0.0))
start = time.perf_counter()
history = lm.fit(train_x, train_y, sample_weight=train_w, batch_size=BATCH_SIZE, epochs=1, verbose=2)
print(f"{STEPS} LoRA steps in {time.perf_counter() - start:.0f} s")
unchanged = [
    path
    for path, value in frozen_before.items()
    if np.array_equal(value, keras.ops.convert_to_numpy(next(v for v in lm.weights if v.path == path)))
]
print(f"{len(unchanged)} of the preset's {len(frozen_before)} weight tensors are bit-for-bit unchanged")
assert len(unchanged) == len(frozen_before)

ppl["LoRA"] = perplexity(keras_logits(lm))
print(f"held-out perplexity: {ppl['gpt_stdlib']:.1f} -> {ppl['LoRA']:.1f} after {STEPS} LoRA steps")
assert ppl["LoRA"] < 0.9 * ppl["gpt_stdlib"]

# %% [markdown]
# ## The adapter alone: save, load on a fresh copy of the preset
#
# `save_lora_weights` writes only the factors (safetensors, with the rank and target names in its
# metadata). Anyone with the same preset loads them onto a model with LoRA enabled the same way
# and gets the same outputs, to the bit.

# %%
adapter = OUT / "keras_source.lora.safetensors"
lm.backbone.save_lora_weights(adapter)
preset_bytes = sum(path.stat().st_size for path in kt.presets.resolve("gpt_stdlib").glob("*.weights.h5"))
print(f"adapter: {adapter.stat().st_size / 1e3:.0f} kB; the preset's weights: {preset_bytes / 1e6:.1f} MB")

fresh = kt.models.GPTCausalLM.from_preset("gpt_stdlib")
fresh.backbone.enable_lora(RANK, target_names=TARGETS)
fresh.backbone.load_lora_weights(adapter)
probe = held_out[0]["token_ids"][:2], held_out[0]["padding_mask"][:2]  # two held-out windows
assert np.array_equal(keras_logits(fresh)(*probe), keras_logits(lm)(*probe))
print("fresh preset + loaded adapter: identical logits")

# %% [markdown]
# ## Merge, then quantize in Keras
#
# `merge_lora` folds A @ B into each kernel: a plain model again, as fast as the preset. We save it
# as a preset and load two copies, quantized to int8 (per-channel scales) and int4 with
# `lm.quantize`: Keras stores the Dense / EinsumDense kernels in 8 or 4 bits and dequantizes them
# inside each layer (the embedding table stays float). `generate` works on the quantized models.

# %%
lora_logits = keras_logits(lm)(*probe)
lm.backbone.merge_lora()
np.testing.assert_allclose(keras_logits(lm)(*probe), lora_logits, atol=1e-4)
merged = OUT / "gpt_stdlib_keras_source"
lm.save_to_preset(merged)
ppl["merged"] = perplexity(keras_logits(lm))

PROMPT = "    def call(self, inputs"
print(f"Keras float32 perplexity {ppl['merged']:6.2f}")
for mode in ("int8", "int4"):
    quantized = kt.models.GPTCausalLM.from_preset(merged)
    quantized.quantize(mode)
    ppl[f"Keras {mode}"] = perplexity(keras_logits(quantized))
    print(f"Keras {mode:7} perplexity {ppl[f'Keras {mode}']:6.2f}   {quantized.generate(PROMPT, max_new_tokens=24)!r}")
assert ppl["Keras int8"] < 1.03 * ppl["merged"] and ppl["Keras int4"] < 1.10 * ppl["merged"]

# %% [markdown]
# ## Export ONNX bundles: float32, int8, int4
#
# `lm.export(dir, format="onnx", quantize="int8")` (or `"int4"`) writes a bundle whose weights are
# stored quantized as its graphs are built, in the formats of ONNX Runtime's quantization tools:
# int8 weights with the activations quantized on the fly, or 4-bit blocks of 32 (`MatMulNBits`).
# A causal LM's graphs are built by ONNX kernels per layer type, from any backend, with no
# TensorFlow: each export takes about a second here. Each bundle runs with its own `generate.py`.

# %%
start = time.perf_counter()
MODES = ["float32", "int8", "int4"]
bundles = {
    mode: lm.export(OUT / f"onnx_{mode}", format="onnx", quantize=None if mode == "float32" else mode, overwrite=True)
    for mode in MODES
}
print(f"three bundles in {time.perf_counter() - start:.1f} s")
# The graphs and their weights on disk: each bundle's two graphs share one weights.data.
size = {
    mode: sum(path.stat().st_size for path in bundle.iterdir() if path.suffix in (".onnx", ".data"))
    for mode, bundle in bundles.items()
}
for mode in bundles:
    ppl[f"ONNX {mode}"] = perplexity(onnx_logits(bundles[mode]))
    print(
        f"{mode:8} graphs and weights {size[mode] / 1e6:5.2f} MB ({size[mode] / size['float32']:4.0%})   "
        f"held-out perplexity {ppl[f'ONNX {mode}']:.2f}"
    )
assert size["int4"] < size["int8"] < size["float32"]
assert abs(ppl["ONNX float32"] / ppl["merged"] - 1) < 1e-3  # the float bundle computes what Keras does
assert ppl["ONNX int8"] < 1.03 * ppl["ONNX float32"] and ppl["ONNX int4"] < 1.10 * ppl["ONNX float32"]

# %% [markdown]
# ## Generation speed of each bundle
#
# Greedy decoding, batch 1, 64 new tokens, with each bundle's own runner (the best of three
# runs after a warm-up). Quantized weights mean fewer bytes to read per step; on a model this
# small the step is mostly fixed costs, so the gain is smaller than on a large one.

# %%
spec = importlib.util.spec_from_file_location("bundle_generate", bundles["float32"] / "generate.py")
generate = importlib.util.module_from_spec(spec)  # the bundle's runner: numpy, onnxruntime and tokenizers only
spec.loader.exec_module(generate)
tokens_per_s, texts = {}, {}
for mode, bundle in bundles.items():
    generator = generate.Generator(bundle)
    prompt_ids = [generator.encode(PROMPT)]
    generator.generate_ids(prompt_ids, max_new_tokens=8)  # warm-up
    seconds = []
    for _ in range(3):
        start = time.perf_counter()
        ids = generator.generate_ids(prompt_ids, max_new_tokens=64, stop_token_ids=None)
        seconds.append(time.perf_counter() - start)
    tokens_per_s[mode] = len(ids[0]) / min(seconds)
    texts[mode] = generator.generate(PROMPT, max_new_tokens=24)
    print(f"{mode:8} {tokens_per_s[mode]:6.0f} tokens/s   {texts[mode]!r}")

# %% [markdown]
# ## Size, speed and perplexity side by side

# %%
modes = MODES
colors = ["C0", "C1", "C2"]
fig, (left, middle, right) = plt.subplots(1, 3, figsize=(13, 3.6))
left.bar(modes, [size[m] / 1e6 for m in modes], color=colors)
left.set(
    ylabel="MB", title=f"ONNX graphs (prefill + decode)\nLoRA adapter alone: {adapter.stat().st_size / 1e3:.0f} kB"
)
middle.bar(modes, [tokens_per_s[m] for m in modes], color=colors)
middle.set(ylabel="tokens / s", title="greedy generation, batch 1 (ONNX Runtime)")
width = 0.38
positions = np.arange(len(modes))
keras_ppl = [ppl["merged"], ppl["Keras int8"], ppl["Keras int4"]]
right.bar(positions - width / 2, keras_ppl, width, label="Keras (lm.quantize)", color="C7")
right.bar(positions + width / 2, [ppl[f"ONNX {m}"] for m in modes], width, label="ONNX bundle", color=colors)
right.axhline(ppl["gpt_stdlib"], color="black", linestyle="--", linewidth=1, label="gpt_stdlib before LoRA")
right.set_xticks(positions, modes)
right.set(ylabel="perplexity", ylim=(0, 1.6 * ppl["gpt_stdlib"]), title="held-out perplexity, Keras source")
right.legend(fontsize=7, loc="upper right")
fig.suptitle(f"gpt_stdlib + LoRA rank {RANK} ({STEPS} steps on Keras's source), merged, then quantized")
fig.tight_layout()
save(fig, "size_speed_perplexity.png")
