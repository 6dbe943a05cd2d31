# %% [markdown]
# # 5. Export to ONNX and SavedModel; run the bundle with ONNX Runtime; compare with Keras
#
# `lm.export(path, format="onnx")` writes a deployment bundle: the model's ONNX graphs (a
# prefill graph that fills the key/value cache from the prompt, and a one-token decode step), the
# tokenizer, the generation settings and `generate.py`, a runner that needs only numpy,
# onnxruntime and tokenizers. `format="tf_saved_model"` writes a TensorFlow SavedModel with the
# forward pass and the whole decoding loop as signatures. A causal LM's bundle is built by ONNX
# kernels per layer type, in this process on any backend; a SavedModel is made under the
# TensorFlow backend (from JAX or PyTorch, `export` runs it in a TensorFlow child process).
#
# We export a tiny GPT both ways and check that the logits and the generated text match Keras.
# Plots go to `$KT_EXAMPLES_OUT/05_export/` (default `examples/out/`).

# %%
import importlib.util
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import matplotlib.pyplot as plt
import numpy as np
import onnxruntime

import keras_transformer as kt
from keras_transformer.corpus import stdlib_texts

EXAMPLES = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()  # script | notebook
OUT = Path(os.environ.get("KT_EXAMPLES_OUT", EXAMPLES / "out")) / "05_export"
OUT.mkdir(parents=True, exist_ok=True)
keras.utils.set_random_seed(0)
print("backend:", keras.config.backend())


def save(fig, name):
    fig.savefig(OUT / name, dpi=80, bbox_inches="tight")
    print("wrote", OUT / name)


# %% [markdown]
# ## A small model to export
#
# A tiny GPT with a BPE tokenizer trained on the standard library. Its weights are the random
# initial ones (notebook 2 trains one): export does not care, and the comparisons below are just
# as strict, down to the last generated token.

# %%
texts = stdlib_texts("train", max_chars=300_000)
tokenizer = kt.tokenizers.BytePairTokenizer.train(texts, vocabulary_size=512)
backbone = kt.models.GPTBackbone(
    vocabulary_size=tokenizer.vocabulary_size,
    num_layers=2,
    num_heads=2,
    hidden_dim=32,
    intermediate_dim=64,
    max_sequence_length=96,
)
lm = kt.models.GPTCausalLM(backbone, kt.models.GPTCausalLMPreprocessor(tokenizer, sequence_length=48, truncate=True))
print(f"{lm.count_params():,} parameters")

# %% [markdown]
# ## Export

# %%
start = time.perf_counter()
bundle = lm.export(OUT / "gpt_onnx", format="onnx", overwrite=True)
print(f"ONNX bundle in {time.perf_counter() - start:.0f} s: {bundle.relative_to(OUT.parent.resolve())}")
for path in sorted(bundle.iterdir()):
    print(f"  {path.name:26} {path.stat().st_size / 1e3:8.1f} kB")
start = time.perf_counter()
saved_model = lm.export(OUT / "gpt_saved_model", format="tf_saved_model", overwrite=True)
print(f"SavedModel in {time.perf_counter() - start:.0f} s: {saved_model.relative_to(OUT.parent.resolve())}")

# %% [markdown]
# ## Logits: Keras vs ONNX Runtime vs SavedModel
#
# The same right-padded batch through the Keras model, the bundle's `prefill.onnx` in an ONNX
# Runtime session (int64 ids and a 0/1 mask, as in Hugging Face's ONNX exports) and the
# SavedModel's `forward` signature. We compare logits at the real (unpadded) positions.

# %%
PROMPTS = ["def __init__(self", "import os\n", "    for line in", "class"]
prompt_ids = lm.preprocessor.generate_preprocess(PROMPTS)  # [start] + ids, one list per prompt
token_ids, real = lm.preprocessor.pad(prompt_ids, length=max(map(len, prompt_ids)))  # (B, T), right-padded
x = {"token_ids": token_ids, "padding_mask": real}
keras_logits = keras.ops.convert_to_numpy(lm(x))  # (B, T, V)

session = onnxruntime.InferenceSession(str(bundle / "prefill.onnx"), providers=["CPUExecutionProvider"])
print("prefill.onnx inputs:", [(i.name, i.shape) for i in session.get_inputs()])
onnx_logits = session.run(
    ["logits"], {"input_ids": x["token_ids"].astype("int64"), "attention_mask": real.astype("int64")}
)[0]

# Loading a SavedModel needs only TensorFlow, whichever backend trained the model.
import tensorflow as tf

loaded = tf.saved_model.load(str(saved_model))
tf_logits = loaded.signatures["forward"](token_ids=tf.constant(x["token_ids"]), padding_mask=tf.constant(real))[
    "logits"
].numpy()

differences = {
    "ONNX Runtime": np.abs(onnx_logits - keras_logits)[real].max(),
    "SavedModel": np.abs(tf_logits - keras_logits)[real].max(),
}
for name, difference in differences.items():
    print(f"max |Keras - {name}| over real positions: {difference:.2e}")
assert max(differences.values()) < 1e-3

fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
others = {"ONNX Runtime": onnx_logits, "SavedModel": tf_logits}
for name, logits in others.items():
    left.plot(keras_logits[real].ravel(), logits[real].ravel(), ".", markersize=2, alpha=0.3, label=name)
    difference = (logits - keras_logits)[real].ravel()
    right.hist(difference, bins=60, range=(-3e-6, 3e-6), alpha=0.6, label=f"{name}: max |diff| {differences[name]:.1e}")
left.set(xlabel="Keras logit", ylabel="exported model's logit", title="Logits, Keras vs exported")
left.legend(markerscale=5)
right.set(xlabel="exported - Keras", ylabel="count", yscale="log", title="Differences")
right.legend(fontsize=8)
fig.suptitle(f"{real.sum()} positions x {tokenizer.vocabulary_size} tokens, trained on {keras.config.backend()}")
fig.tight_layout()
save(fig, "logits_parity.png")

# %% [markdown]
# ## Generation: `lm.generate` vs the bundle's runner vs the SavedModel's loop
#
# The runner's decoding loop is the one of `keras_transformer.samplers`, step for step, so
# greedy and beam search give the same text.

# %%
spec = importlib.util.spec_from_file_location("bundle_generate", bundle / "generate.py")
runner = importlib.util.module_from_spec(spec)
spec.loader.exec_module(runner)
generator = runner.Generator(bundle)

for sampler, options in [("greedy", {}), ("beam", {"num_beams": 3})]:
    keras_sampler = sampler if sampler == "greedy" else kt.samplers.BeamSampler(num_beams=3)
    from_keras = lm.generate(PROMPTS, max_new_tokens=16, sampler=keras_sampler)
    from_onnx = generator.generate(PROMPTS, max_new_tokens=16, sampler=sampler, **options)
    print(f"--- {sampler}: identical = {from_keras == from_onnx}")
    for text in from_onnx[:2]:
        print("   ", repr(text))
    assert from_keras == from_onnx

# The SavedModel's `generate` and `generate_beam` signatures: ids in, ids out, the Keras decoding
# loop itself inside the graph (the same samplers and noise: a seed gives the same tokens).
prompts = {
    "token_ids": tf.constant(x["token_ids"]),
    "padding_mask": tf.constant(real),
    "max_new_tokens": tf.constant(16),
    "min_new_tokens": tf.constant(0),
    "repetition_penalty": tf.constant(1.0),
}


def texts(outputs):
    return [
        tokenizer.detokenize(np.asarray(row)[np.asarray(mask)])
        for row, mask in zip(outputs["token_ids"], outputs["padding_mask"])
    ]


for name, outputs, keras_sampler in [
    (
        "greedy",
        loaded.generate(
            **prompts, temperature=tf.constant(0.0), top_k=tf.constant(0), top_p=tf.constant(1.0), seed=tf.constant(0)
        ),
        "greedy",
    ),
    (
        "random",
        loaded.generate(
            **prompts, temperature=tf.constant(0.8), top_k=tf.constant(40), top_p=tf.constant(0.9), seed=tf.constant(7)
        ),
        kt.samplers.RandomSampler(temperature=0.8, top_k=40, top_p=0.9, seed=7),
    ),
    ("beam-4", loaded.generate_beam(**prompts, length_penalty=tf.constant(1.0)), kt.samplers.BeamSampler(num_beams=4)),
]:
    identical = texts(outputs) == lm.generate(PROMPTS, max_new_tokens=16, sampler=keras_sampler)
    print(f"SavedModel {name} identical:", identical)
    assert identical

# %% [markdown]
# ## The bundle without Keras
#
# `generate.py` is also a command line; run in a fresh process it imports neither Keras nor a
# deep-learning framework.

# %%
command = [sys.executable, str(bundle / "generate.py"), "--prompt", "def __init__(self", "--max-new-tokens", "16"]
result = subprocess.run(command, capture_output=True, text=True, check=True)
print("$ python", shlex.join([str(Path(command[1]).relative_to(OUT.parent.resolve())), *command[2:]]))
print(result.stdout)
