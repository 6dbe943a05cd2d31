# %% [markdown]
# # 7. Scale past one device: data and model parallelism
#
# When a batch or a model outgrows one accelerator you keep the same tasks, `fit` and `generate`:
# Keras 3's distribution API does the work, and every backbone says how to split itself with
# `get_layout_map(device_mesh)` (the Megatron pattern: attention heads and feed-forward columns
# along a "model" axis). In Keras 3.15 the distribution API runs on **JAX** only; on TensorFlow and
# PyTorch our helpers raise one clear error instead.
#
# This notebook runs on any backend: the distributed part runs in a child process with
# `KERAS_BACKEND=jax` and 8 *virtual* CPU devices (`XLA_FLAGS=--xla_force_host_platform_device_count=8`,
# which JAX reads once, when it is imported). On a machine with 8 GPUs the same code runs on the
# GPUs: drop the flag. Full guide: `docs/distribution.md`.
#
# Plots go to `$KT_EXAMPLES_OUT/07_scale_out/` (default `examples/out/`).

# %%
import json
import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import matplotlib.pyplot as plt

import keras_transformer as kt

EXAMPLES = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()  # script | notebook
OUT = Path(os.environ.get("KT_EXAMPLES_OUT", EXAMPLES / "out")) / "07_scale_out"
OUT.mkdir(parents=True, exist_ok=True)
print("backend:", keras.config.backend())

# %% [markdown]
# ## On this backend
#
# Asking for a distribution where Keras has none gives one error that says what is supported.

# %%
try:
    kt.distribution.data_parallel()
    print("the distribution API is available here: this kernel runs JAX")
except NotImplementedError as error:
    print("NotImplementedError:", error)

# %% [markdown]
# ## One host, several devices (a JAX child process with 8 devices)
#
# The child builds a tiny GPT three times from the same initial weights and takes one `fit` step:
# on one device; under `DataParallel` on a mesh `(8,)` (weights replicated, the batch split in 8);
# under `ModelParallel` on a mesh `(2, 4)` ("batch" x "model": 2 replicas, each layer split over 4
# devices). Then it decodes greedily under `ModelParallel` and on one device. It reports the losses,
# the sharding of a few weights, and how many bytes of weights each device holds.

# %%
CHILD = r"""
import json, random
import keras, numpy as np
import keras_transformer as kt

random.seed(0)  # Keras draws its initializers' seeds from Python's generator
devices = keras.distribution.list_devices()
rng = np.random.default_rng(0)
ids = rng.integers(1, 256, (16, 32)).astype("int32")
x = {"token_ids": ids[:, :-1], "padding_mask": np.ones((16, 31), bool)}
y, w = ids[:, 1:], np.ones((16, 31), "float32")

def build():
    backbone = kt.models.GPTBackbone(256, num_layers=2, num_heads=4, hidden_dim=64, intermediate_dim=256,
                                     max_sequence_length=64, dropout=0.0)
    return kt.models.GPTCausalLM(backbone)

def one_step(lm, weights):
    lm.set_weights(weights)
    lm.compile()
    return float(lm.fit(x, y, sample_weight=w, batch_size=16, epochs=1, shuffle=False, verbose=0).history["loss"][0])

def bytes_per_device(lm):
    return int(sum(v.value.addressable_shards[0].data.nbytes for v in lm.weights))

reference = build()
initial = reference.get_weights()
report = {"devices": [str(d) for d in devices], "one_device": {"loss": one_step(reference, initial),
                                                               "bytes": bytes_per_device(reference)}}

with kt.distribution.data_parallel().scope():
    lm = build()
    report["data_parallel"] = {"loss": one_step(lm, initial), "bytes": bytes_per_device(lm)}

distribution = kt.distribution.model_parallel(reference.backbone, (2, 4))
with distribution.scope():
    lm = build()
    report["model_parallel"] = {"loss": one_step(lm, initial), "bytes": bytes_per_device(lm)}
    report["specs"] = {v.path: [str(a) for a in v.value.sharding.spec] for v in lm.weights
                       if v.path.startswith("transformer_layer_0/") and len(v.shape) > 1}
    prompt = [[5, 9, 17, 33]]
    report["generate_model_parallel"] = lm.generate(prompt, max_new_tokens=8, stop_token_ids=None)[0]
reference.set_weights(lm.get_weights())
report["generate_one_device"] = reference.generate(prompt, max_new_tokens=8, stop_token_ids=None)[0]
print("REPORT " + json.dumps(report, default=int))
"""

env = {
    **os.environ,
    "KERAS_BACKEND": "jax",
    "JAX_PLATFORMS": "cpu",
    "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
    "TF_CPP_MIN_LOG_LEVEL": "3",
}
result = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True)
if result.returncode != 0:
    raise RuntimeError(f"the JAX child failed:\n{result.stderr[-3000:]}")
report = json.loads(next(line for line in result.stdout.splitlines() if line.startswith("REPORT "))[7:])
print(len(report["devices"]), "devices:", ", ".join(report["devices"][:3]), "...")
for name in ("one_device", "data_parallel", "model_parallel"):
    print(
        f"{name:15} loss after one step {report[name]['loss']:.6f}   weights per device "
        f"{report[name]['bytes'] / 1e6:.2f} MB"
    )
losses = [report[name]["loss"] for name in ("one_device", "data_parallel", "model_parallel")]
assert max(losses) - min(losses) < 1e-5, losses

# %% [markdown]
# ## Where the weights live
#
# Under `ModelParallel`, each attention projection keeps whole heads on a device (the query, key and
# value kernels `(D, H, Dh)` are split along H) and each feed-forward keeps whole columns; so a block
# needs two all-reduces, after attention and after the feed-forward. Greedy decoding under the
# distribution gives the same tokens as on one device.

# %%
for path, spec in report["specs"].items():
    print(f"{path:60} {tuple(spec)}")
print("greedy under ModelParallel:", report["generate_model_parallel"])
print("greedy on one device:      ", report["generate_one_device"])
assert report["generate_model_parallel"] == report["generate_one_device"]

fig, ax = plt.subplots(figsize=(5.5, 3))
names = ["one device", "DataParallel (8,)", "ModelParallel (2, 4)"]
megabytes = [report[key]["bytes"] / 1e6 for key in ("one_device", "data_parallel", "model_parallel")]
ax.bar(names, megabytes, color=["C0", "C1", "C2"])
ax.set(ylabel="MB of weights per device", title="The same GPT, three ways")
fig.tight_layout()
fig.savefig(OUT / "weights_per_device.png", dpi=80, bbox_inches="tight")
print("wrote", OUT / "weights_per_device.png")

# %% [markdown]
# ## Several hosts
#
# Start the same script on every host. Before building anything, each process joins the cluster,
# then the mesh spans every host's devices; keep the "model" axis inside a host (its all-reduces
# are the frequent ones) and let "batch" span hosts:
#
# ```python
# keras.distribution.initialize(job_addresses="10.0.0.1:1234", num_processes=2,
#                               process_id=int(os.environ["PROCESS_ID"]))
# devices = keras.distribution.list_devices()          # 2 hosts x 8 GPUs = 16
# mesh = keras.distribution.DeviceMesh((4, 4), ("batch", "model"), devices)
# distribution = keras.distribution.ModelParallel(layout_map=backbone.get_layout_map(mesh),
#                                                 batch_dim_name="batch")
# ```
#
# With arrays or raw strings, `batch_size` is per process; a `tf.data.Dataset` is split between
# processes automatically. Several hosts are not exercised here (one machine); see
# `docs/distribution.md`.
