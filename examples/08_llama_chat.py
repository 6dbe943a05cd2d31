# %% [markdown]
# # 8. A Llama-style checkpoint: load it, check it against transformers, chat with it
#
# Modern decoder-only models (Llama 3, Qwen2.5, Mistral, SmolLM2) share one layout: rotary
# positions (RoPE), grouped-query attention, RMS norm and a SwiGLU feed-forward.
# `kt.models.CausalLM.from_preset` reads such a Hugging Face checkpoint directory
# (`config.json`, `model.safetensors`, `tokenizer.json`, `tokenizer_config.json` with its chat
# template), or an `hf://org/name` handle, and returns a `LlamaCausalLM` that runs on every
# backend.
#
# This machine is offline, so we make the checkpoint ourselves: a small Qwen2-shaped
# `transformers` model with random weights and a ChatML template, saved with `save_pretrained`.
# Its replies are noise (the weights are random); what we check is that ours are the very tokens
# `transformers` produces. Then the trained `llama_stdlib` preset writes some Python, and we
# compare it with `gpt_stdlib`, trained on the same data at the same size.
# Plots go to `$KT_EXAMPLES_OUT/08_llama_chat/` (default `examples/out/`).

# %%
import json
import os
import tempfile
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import matplotlib.pyplot as plt
import numpy as np
import torch
import transformers

import keras_transformer as kt
from keras_transformer import presets

EXAMPLES = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()  # script | notebook
OUT = Path(os.environ.get("KT_EXAMPLES_OUT", EXAMPLES / "out")) / "08_llama_chat"
OUT.mkdir(parents=True, exist_ok=True)
keras.utils.set_random_seed(0)
torch.manual_seed(0)
print("backend:", keras.config.backend())


def save(fig, name):
    fig.savefig(OUT / name, dpi=80, bbox_inches="tight")
    print("wrote", OUT / name)


# %% [markdown]
# ## A Qwen2-shaped checkpoint, written by transformers
#
# The tokenizer is `llama_stdlib`'s byte-level BPE plus ChatML's two markers; the template is
# the ChatML form Qwen2.5 and SmolLM2 use. Qwen2 has biases on the query/key/value projections
# and none on the output, two key/value heads for four query heads, and `rope_theta` 1e6.

# %%
checkpoint = Path(tempfile.mkdtemp()) / "qwen2_tiny"
backend_tokenizer = kt.tokenizers.Tokenizer.load(presets.resolve("llama_stdlib")).backend_tokenizer
backend_tokenizer.add_special_tokens(["<|im_start|>", "<|im_end|>"])
hf_tokenizer = transformers.PreTrainedTokenizerFast(
    tokenizer_object=backend_tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>"
)
hf_tokenizer.chat_template = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
config = transformers.Qwen2Config(
    vocab_size=len(hf_tokenizer),
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rope_theta=1e6,
    tie_word_embeddings=True,
    eos_token_id=hf_tokenizer.eos_token_id,
    pad_token_id=hf_tokenizer.pad_token_id,
)
hf_model = transformers.Qwen2ForCausalLM(config).eval()
with torch.no_grad():  # larger weights than the default init: peaked, decisive next-token choices
    for parameter in hf_model.parameters():
        parameter.mul_(8.0 if parameter.dim() > 1 else 1.0)
hf_model.save_pretrained(checkpoint)
hf_tokenizer.save_pretrained(checkpoint)
print(sorted(path.name for path in checkpoint.iterdir()))
print(
    json.dumps(
        {
            k: v
            for k, v in json.loads((checkpoint / "config.json").read_text()).items()
            if k in ("model_type", "num_key_value_heads", "rope_theta", "tie_word_embeddings")
        }
    )
)

# %% [markdown]
# ## Load it: the base class picks the family
#
# `CausalLM.from_preset` reads `model_type` ("qwen2"), converts the config and the weights
# (on the fly; `keras-transformer convert` writes our preset format once) and returns a
# `LlamaCausalLM`. The logits of a batch of token ids are compared with transformers'.

# %%
lm = kt.models.CausalLM.from_preset(str(checkpoint))
print(
    type(lm).__name__,
    lm.backbone.num_key_value_heads,
    "key/value heads,",
    "q/k/v bias:",
    lm.backbone.attention_bias,
    "output bias:",
    lm.backbone.attention_output_bias,
)

ids = np.random.default_rng(0).integers(0, len(hf_tokenizer), (2, 24)).astype("int32")
ours = np.asarray(lm.predict({"token_ids": ids, "padding_mask": np.ones_like(ids, bool)}, verbose=0))
with torch.no_grad():
    theirs = hf_model(torch.as_tensor(ids, dtype=torch.long)).logits.numpy()
difference = np.abs(ours - theirs).max()
print(f"largest logit difference from transformers: {difference:.2e}")
assert difference < 1e-3

fig, ax = plt.subplots(figsize=(4.5, 4))
ax.scatter(theirs[0, :, :400].ravel(), ours[0, :, :400].ravel(), s=2, alpha=0.4)
ax.set_xlabel("transformers logit")
ax.set_ylabel("keras_transformer logit")
ax.set_title(f"Qwen2-shaped checkpoint, {keras.config.backend()}\nmax |difference| {difference:.1e}")
save(fig, "logits_vs_transformers.png")

# %% [markdown]
# ## Chat
#
# With a chat template in the tokenizer, `generate` takes messages: it renders them as
# transformers' `apply_chat_template(..., add_generation_prompt=True)` does and returns the
# reply. Greedy decoding here and in transformers gives the same tokens.

# %%
chat = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "def add(a, b):"}]
prompt = lm.preprocessor.tokenizer.apply_chat_template(chat, add_generation_prompt=True)
print(prompt)
assert prompt == hf_tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
reply = lm.generate(chat, max_new_tokens=24, sampler="greedy")
print("reply:", repr(reply))

prompt_ids = hf_tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_dict=True, return_tensors="pt")[
    "input_ids"
]
with torch.no_grad():
    hf_ids = hf_model.generate(prompt_ids, max_new_tokens=24, do_sample=False)[0, prompt_ids.shape[1] :]
hf_reply = hf_tokenizer.decode(hf_ids, skip_special_tokens=True)
print("transformers:", repr(hf_reply))
assert reply == hf_reply

# %% [markdown]
# ## A trained one: `llama_stdlib` against `gpt_stdlib`
#
# Both presets were trained on the Python standard library with the same tokenizer, data,
# optimizer and 577 steps, at equal parameters. We re-measure their held-out perplexity on the
# first 32 held-out windows (their model cards report all 256) and let the Llama-style one
# continue a line of Python.

# %%
import sys  # noqa: E402

sys.path.insert(0, str(EXAMPLES.parent / "tools"))
import train_presets  # noqa: E402  (the recipes' own held-out data)


def perplexity(name, windows=32):
    task = kt.models.CausalLM.from_preset(name)
    inputs, labels = train_presets.gpt_eval_data(task.preprocessor.tokenizer)
    inputs, labels = inputs[:windows], labels[:windows]
    logits = np.asarray(task.predict({"token_ids": inputs, "padding_mask": np.ones_like(inputs, bool)}, verbose=0))
    logits = logits.astype("float64") - logits.max(-1, keepdims=True)
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    return float(np.exp(-np.take_along_axis(log_probs, labels[..., None], -1).mean())), task


scores = {}
for name in ("gpt_stdlib", "llama_stdlib"):
    scores[name], task = perplexity(name)
    print(f"{name}: {task.count_params():,} parameters, held-out perplexity {scores[name]:.1f}")
assert scores["llama_stdlib"] < scores["gpt_stdlib"]
print(task.generate("def __init__(self", max_new_tokens=40, sampler="greedy", no_repeat_ngram_size=3))

fig, ax = plt.subplots(figsize=(4.5, 3))
ax.bar(list(scores), list(scores.values()), color=["tab:gray", "tab:blue"])
ax.set_ylabel("held-out perplexity (lower is better)")
ax.set_title("same data, steps and size")
save(fig, "perplexity.png")
