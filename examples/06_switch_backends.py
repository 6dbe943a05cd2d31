# %% [markdown]
# # 6. Switch backends with `KERAS_BACKEND`
#
# Keras 3 reads `KERAS_BACKEND` (tensorflow, jax or torch) once, when it is first imported, so one
# process runs one backend. Models and presets do not depend on it: we train a tiny GPT on the
# backend this notebook runs on, save it as a preset, then load that preset in two child processes
# running the other two backends, and check that greedy generation gives the same text
# everywhere and that the logits agree to float32 rounding. Last, how fast each backend runs
# against keras-hub, from the README's benchmark table.
#
# Plots go to `$KT_EXAMPLES_OUT/06_switch_backends/` (default `examples/out/`).

# %%
import json
import os
import re
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import matplotlib.pyplot as plt
import numpy as np

import keras_transformer as kt
from keras_transformer.corpus import stdlib_texts

EXAMPLES = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()  # script | notebook
OUT = Path(os.environ.get("KT_EXAMPLES_OUT", EXAMPLES / "out")) / "06_switch_backends"
OUT.mkdir(parents=True, exist_ok=True)
keras.utils.set_random_seed(0)
HERE = keras.config.backend()
OTHERS = [backend for backend in ("tensorflow", "jax", "torch") if backend != HERE]
print("backend:", HERE, "- the child processes will run", " and ".join(OTHERS))


def save(fig, name):
    fig.savefig(OUT / name, dpi=80, bbox_inches="tight")
    print("wrote", OUT / name)


# %% [markdown]
# ## Train on this backend, save a preset
#
# `save_to_preset` writes the configuration, the weights, the tokenizer and the preprocessor
# settings into one directory; `from_preset` rebuilds the task from it on any backend.

# %%
texts = stdlib_texts("train", max_chars=300_000)
tokenizer = kt.tokenizers.BytePairTokenizer.train(texts, vocabulary_size=512)
chunks = [text[i : i + 160] for text in texts for i in range(0, len(text) - 160, 160)][:960]
backbone = kt.models.GPTBackbone(
    vocabulary_size=tokenizer.vocabulary_size,
    num_layers=2,
    num_heads=2,
    hidden_dim=32,
    intermediate_dim=64,
    max_sequence_length=96,
)
lm = kt.models.GPTCausalLM(backbone, kt.models.GPTCausalLMPreprocessor(tokenizer, sequence_length=48, truncate=True))
lm.compile(optimizer=keras.optimizers.AdamW(5e-3, weight_decay=0.01))
lm.fit(chunks, batch_size=32, epochs=2, verbose=2)

preset = OUT / f"gpt_trained_on_{HERE}"
lm.save_to_preset(preset)
print(preset, sorted(path.name for path in preset.iterdir()))

# %% [markdown]
# ## Generate here, and in the other backends
#
# Each child is a fresh Python process with `KERAS_BACKEND` set in its environment. It loads the
# preset, generates greedily from the same prompts, and writes its texts and its logits on a fixed
# batch for us to compare.

# %%
PROMPTS = ["def __init__(self", "import os\n", "    for line in", "class"]
MAX_NEW_TOKENS = 16
CHILD = """
import json, sys
import keras, numpy as np
import keras_transformer as kt

preset, prompts, max_new_tokens, logits_file = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
lm = kt.models.GPTCausalLM.from_preset(preset)
x, _, _ = lm.preprocessor(prompts)
np.save(logits_file, keras.ops.convert_to_numpy(lm(x)))
texts = lm.generate(prompts, max_new_tokens=max_new_tokens, sampler="greedy")
print(json.dumps({"backend": keras.config.backend(), "texts": texts}))
"""

x, _, _ = lm.preprocessor(PROMPTS)
logits = {HERE: keras.ops.convert_to_numpy(lm(x))}  # (B, T, V)
texts = {HERE: lm.generate(PROMPTS, max_new_tokens=MAX_NEW_TOKENS, sampler="greedy")}
for backend in OTHERS:
    logits_file = OUT / f"logits_{backend}.npy"
    result = subprocess.run(
        [sys.executable, "-c", CHILD, str(preset), json.dumps(PROMPTS), str(MAX_NEW_TOKENS), str(logits_file)],
        env={**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3"},
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        raise RuntimeError(f"the {backend} child failed:\n{result.stderr[-3000:]}")
    reply = json.loads(result.stdout.strip().splitlines()[-1])
    assert reply["backend"] == backend
    texts[backend] = reply["texts"]
    logits[backend] = np.load(logits_file)

for i, prompt in enumerate(PROMPTS):
    print(f"=== {prompt!r}")
    for backend, outputs in texts.items():
        print(f"  {backend:10} {outputs[i][len(prompt) :]!r}")
identical = all(texts[backend] == texts[HERE] for backend in OTHERS)
print("greedy output identical on all three backends:", identical)
assert identical

# %% [markdown]
# ## How close are the logits?
#
# Different backends run different kernels, so the logits differ in the last bits of float32;
# the largest difference at the real (unpadded) positions stays around 1e-6, far too small to
# change a greedy choice except at an exact tie.

# %%
real = x["padding_mask"]
differences = {backend: np.abs(logits[backend] - logits[HERE])[real].max() for backend in OTHERS}
for backend, difference in differences.items():
    print(f"max |logits({HERE}) - logits({backend})| = {difference:.2e}")
assert max(differences.values()) < 1e-4

fig, ax = plt.subplots(figsize=(5, 3))
ax.bar([f"{HERE} vs {backend}" for backend in OTHERS], list(differences.values()), color=["C0", "C1"])
ax.set(
    yscale="log",
    ylim=(1e-9, 1e-3),
    ylabel="max |logit difference|",
    title=f"Preset trained on {HERE}, loaded on every backend",
)
ax.axhline(1e-4, color="gray", linestyle="--", linewidth=1, label="tolerance asserted above")
ax.legend()
fig.tight_layout()
save(fig, "backend_logit_differences.png")

# %% [markdown]
# ## How fast is each backend?
#
# The README's benchmark table gives our speed over keras-hub's for the same model shape, per
# backend (`benchmarks/`, measured on the project's 2-core CPU). We read the table from
# README.md, so its numbers live in one place, and draw the rows that are ratios against keras-hub:
# a range (several runs or rounds) is a bar to its middle with a line over the range.

# %%
RATIO = re.compile(r"^(\d+(?:\.\d+)?)(?:-(\d+(?:\.\d+)?))?$")  # "1.02" or "1.59-1.85"


def benchmark_table(readme):
    """The first table under "## Benchmarks": its header, and its rows as lists of cells."""
    section = readme.split("\n## Benchmarks", 1)[1].split("\n## ", 1)[0]
    rows, started = [], False
    for line in section.splitlines():
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
            started = True
        elif started:
            break
    return rows[0], [row for row in rows[2:] if len(row) == len(rows[0])]  # rows[1] is the |---| line


header, rows = benchmark_table((EXAMPLES.parent / "README.md").read_text())
assert header[0] == "ours / keras-hub", header
backends = header[1:4]  # JAX, TensorFlow, PyTorch
ratios = {}  # row label -> [(low, high) per backend]
for label, *cells in rows:
    parsed = [RATIO.match(cell) for cell in cells[:3]]
    if label.endswith(", ours") or not all(parsed):  # a "..., ours" row measures ours alone
        continue
    label = re.sub(r"\s*\(\d{4}-\d{2}-\d{2}\)|;\s*\d{4}-\d{2}-\d{2}", "", label.replace("`", ""))
    ratios[label] = [(float(m[1]), float(m[2] or m[1])) for m in parsed]
for label, values in ratios.items():
    print(
        f"{label:56}",
        "  ".join(f"{b} {lo:.2f}" + (f"-{hi:.2f}" if hi > lo else "") for b, (lo, hi) in zip(backends, values)),
    )
assert len(ratios) >= 5 and all(0 < lo <= hi for values in ratios.values() for lo, hi in values)

fig, ax = plt.subplots(figsize=(9, 0.55 * len(ratios) + 1.2))
height = 0.8 / len(backends)
for b, backend in enumerate(backends):
    low, high = np.array([values[b] for values in ratios.values()]).T
    middle = (low + high) / 2
    y = np.arange(len(ratios)) + (b - (len(backends) - 1) / 2) * height
    ax.barh(y, middle, height, label=backend, color=f"C{b}")
    ax.errorbar(middle, y, xerr=[middle - low, high - middle], fmt="none", ecolor="black", elinewidth=1, capsize=2)
ax.axvline(1.0, color="gray", linestyle="--", linewidth=1)
extremes = np.array(list(ratios.values())).ravel()
ticks = [t for t in (0.25, 0.5, 1, 2, 4, 8, 16, 32) if extremes.min() / 2 <= t <= extremes.max() * 2]
ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
ax.tick_params(axis="x", which="minor", labelbottom=False)
ax.set_yticks(range(len(ratios)), list(ratios), fontsize=8)
ax.invert_yaxis()
ax.set(
    xscale="log",
    xlabel="speed, ours / keras-hub (log scale; 1 = as fast; README benchmark table)",
    title="keras_transformer against keras-hub, same model shape, on each backend (2-core CPU)",
)
ax.legend(loc="lower right")
fig.tight_layout()
save(fig, "speed_vs_keras_hub.png")
