"""Train the presets that ship weights: gpt_stdlib, llama_stdlib, llama_stdlib_draft, moe_stdlib, bert_stdlib and
t5_reverse.

    KERAS_BACKEND=jax python tools/train_presets.py gpt_stdlib     # or llama_stdlib, bert_stdlib, t5_reverse; none: all
    KERAS_BACKEND=jax python tools/train_presets.py --quantized gpt_stdlib   # only the metrics after task.quantize

Each recipe seeds everything, trains with `fit`, measures its metric on a fixed held-out set, and writes
models/<name>/ with `save_to_preset`, plus metrics.json (machine-readable) and the model card README.md;
for the language models, the same metrics after Keras's `task.quantize("int8")` and `("int4")` are added to both.
tests/test_trained_presets.py re-measures every metric on every backend from the functions `*_eval_data` below.
JAX is the fastest backend for training on this CPU (measured: 1.1 s/step against 1.4 for TensorFlow, 5.9 for PyTorch).
"""

import hashlib
import json
import os
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "jax")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_transformer as kt  # noqa: E402
from keras_transformer.corpus import stdlib_files, stdlib_texts  # noqa: E402

ZOO = Path(__file__).resolve().parent.parent / "models"
SEED = 0
EVAL_SEED = 1234  # the held-out masking of bert_stdlib and the held-out sequences of t5_reverse


def fingerprint(*arrays):
    """sha256 of the evaluation data, so a test can tell "other data" (another Python's stdlib) from "other weights"."""
    digest = hashlib.sha256()
    for array in arrays:
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


# === gpt_stdlib: next-token prediction on the standard library's source =====================

GPT_LENGTH = 128  # tokens per window; the model reads 128 and predicts the next 128
GPT_EVAL_WINDOWS = 256


def token_stream(tokenizer, texts):
    """Every file as [<|endoftext|>] + its tokens, concatenated: (N,) int32."""
    ids = tokenizer.tokenize(texts)
    return np.concatenate([[tokenizer.eos_token_id] + row for row in ids]).astype("int32")


def windows(stream, length=GPT_LENGTH):
    """Non-overlapping windows of length + 1 tokens: inputs (W, T), labels (W, T) shifted by one."""
    count = len(stream) // (length + 1)
    chunks = stream[: count * (length + 1)].reshape(count, length + 1)  # (W, T + 1)
    return chunks[:, :-1], chunks[:, 1:]


def gpt_eval_data(tokenizer):
    """The fixed held-out slice: the first 256 windows of the held-out files (32,768 predicted tokens)."""
    inputs, labels = windows(token_stream(tokenizer, stdlib_texts("held_out")))
    return inputs[:GPT_EVAL_WINDOWS], labels[:GPT_EVAL_WINDOWS]


def train_gpt_stdlib(steps=580, batch_size=32):
    def task(tokenizer):
        backbone = kt.models.GPTBackbone(
            vocabulary_size=tokenizer.vocabulary_size,
            num_layers=2,
            num_heads=4,
            hidden_dim=128,
            intermediate_dim=512,
            max_sequence_length=GPT_LENGTH,
        )
        return kt.models.GPTCausalLM(backbone, kt.models.GPTCausalLMPreprocessor(tokenizer, sequence_length=GPT_LENGTH))

    _train_causal_stdlib(
        "gpt_stdlib",
        "GPT-style decoder trained on the Python standard library: 2 layers, d 128, 4 heads, byte-level BPE 4096.",
        task,
        steps,
        batch_size,
    )


def _llama_task(**config):
    """`_train_causal_stdlib`'s make_task: a LlamaCausalLM of `config` (LlamaBackbone arguments) over the tokenizer
    it is given, GPT_LENGTH positions."""

    def task(tokenizer):
        backbone = kt.models.LlamaBackbone(
            vocabulary_size=tokenizer.vocabulary_size, max_sequence_length=GPT_LENGTH, **config
        )
        return kt.models.LlamaCausalLM(
            backbone, kt.models.LlamaCausalLMPreprocessor(tokenizer, sequence_length=GPT_LENGTH)
        )

    return task


def train_llama_stdlib(steps=580, batch_size=32):
    """gpt_stdlib's data, tokenizer, optimizer and steps, with a Llama-style decoder of the same parameter count
    (RoPE instead of learned positions, RMS norm, SwiGLU of width 366 instead of a GELU MLP of 512, no biases)."""

    task = _llama_task(num_layers=2, num_heads=4, hidden_dim=128, intermediate_dim=366)
    _train_causal_stdlib(
        "llama_stdlib",
        "Llama-style decoder trained on the Python standard library: 2 layers, "
        "d 128, 4 heads, SwiGLU 366, RoPE, RMS norm, byte-level BPE 4096 (gpt_stdlib's data, steps "
        "and parameter count).",
        task,
        steps,
        batch_size,
        same_as=", as gpt_stdlib",
    )


def train_llama_stdlib_draft(steps=580, batch_size=32):
    """A draft model for speculative decoding with `llama_stdlib` (issue 41): its tokenizer (read from the
    preset, so that the vocabularies are one), data, optimizer and steps; one layer, half as wide."""

    task = _llama_task(num_layers=1, num_heads=2, hidden_dim=64, intermediate_dim=172)
    _train_causal_stdlib(
        "llama_stdlib_draft",
        "Draft model for speculative decoding with llama_stdlib (its tokenizer): a Llama-style decoder of 1 layer, "
        "d 64, 2 heads, SwiGLU 172, RoPE, RMS norm, trained on llama_stdlib's data and steps.",
        task,
        steps,
        batch_size,
        same_as=", as llama_stdlib",
        tokenizer_from="llama_stdlib",
    )


def train_moe_stdlib(steps=580, batch_size=32):
    """llama_stdlib with a sparse mixture of experts (issue 39): each feed-forward is 4 SwiGLU experts of width
    183 with the top 2 per token (llama_stdlib's 366 active), the load-balancing loss at 0.01 as Mixtral's
    checkpoints set it; the experts' load is in `fit`'s logs (`ExpertLoad`)."""

    task = _llama_task(
        num_layers=2,
        num_heads=4,
        hidden_dim=128,
        intermediate_dim=366,
        mixture_of_experts={"num_experts": 4, "top_k": 2, "intermediate_dim": 183},
        router_aux_loss_coef=0.01,
    )
    _train_causal_stdlib(
        "moe_stdlib",
        "Mixture-of-experts Llama-style decoder trained on the Python standard library: 2 layers, d 128, 4 heads, "
        "4 SwiGLU experts of 183 with the top 2 per token (366 active, as llama_stdlib), RoPE, RMS norm, "
        "byte-level BPE 4096 (llama_stdlib's tokenizer, data and steps).",
        task,
        steps,
        batch_size,
        same_as=", as llama_stdlib",
        tokenizer_from="llama_stdlib",
        callbacks=[kt.models.ExpertLoad()],
    )


def _train_causal_stdlib(
    name, description, make_task, steps, batch_size, same_as="", tokenizer_from=None, callbacks=None
):
    """Next-token training of `make_task(tokenizer)` on the standard library: one pass over shuffled windows.
    tokenizer_from: a preset whose tokenizer to use (a draft model's target), else one trained here."""
    train_texts = stdlib_texts("train")
    if tokenizer_from is None:
        tokenizer = kt.tokenizers.BytePairTokenizer.train(train_texts, vocabulary_size=4096)
    else:
        tokenizer = kt.models.CausalLM.from_preset(tokenizer_from).preprocessor.tokenizer
    inputs, labels = windows(token_stream(tokenizer, train_texts))
    order = np.random.default_rng(SEED).permutation(len(inputs))[: steps * batch_size]
    steps = -(-len(order) // batch_size)  # fewer when the corpus runs out: one pass at most
    lm = make_task(tokenizer)
    lm.compile(optimizer=_adamw(3e-3, steps))
    eval_inputs, eval_labels = gpt_eval_data(tokenizer)
    baseline = _gpt_evaluate(type(lm)(_clone(lm.backbone)), eval_inputs, eval_labels)
    start = time.time()
    history = lm.fit(
        {"token_ids": inputs[order], "padding_mask": np.ones_like(inputs[order], bool)},
        labels[order],
        batch_size=batch_size,
        epochs=1,
        shuffle=False,
        verbose=2,
        callbacks=callbacks,
    ).history
    train_seconds = time.time() - start
    # a mixture of experts: the experts' load over the epoch (`ExpertLoad`; balanced: 1 / E each)
    load = {key: round(float(values[-1]), 4) for key, values in history.items() if key.startswith("expert_load")}
    metrics = _gpt_evaluate(lm, eval_inputs, eval_labels)
    prompts = ("import", "def __init__(self", "    for")
    samples = {prompt: lm.generate(prompt, max_new_tokens=40, sampler="greedy") for prompt in prompts}
    data = {
        "train": f"{len(train_texts)} files, {sum(map(len, train_texts)):,} characters, {len(inputs):,} windows of "
        f"{GPT_LENGTH + 1} tokens; trained on {len(order):,} of them ({len(order) * GPT_LENGTH:,} tokens, "
        f"one pass, batch {batch_size}, {steps} steps){same_as}",
        "eval": f"the first {GPT_EVAL_WINDOWS} windows of {GPT_LENGTH + 1} tokens of the held-out files "
        f"({GPT_EVAL_WINDOWS * GPT_LENGTH:,} predicted tokens){same_as}",
    }
    sample_text = "\n\n".join(
        f"Prompt {prompt!r}, greedy, 40 new tokens:\n\n```python\n{text}\n```" for prompt, text in samples.items()
    )
    write_preset(
        lm,
        name,
        description,
        data,
        metrics,
        baseline,
        train_seconds,
        {"eval_data_sha256": fingerprint(eval_inputs, eval_labels), **({"expert_load": load} if load else {})},
        sample_text + (_load_text(load) if load else ""),
    )


def _load_text(load):
    return (
        "\n\nThe experts' load over training (`kt.models.ExpertLoad` in `fit`'s logs: each expert's share of the "
        f"routed assignments, averaged over the epoch; 1 / E = 0.25 each if balanced): min "
        f"{load['expert_load_min']:.4f}, max {load['expert_load_max']:.4f}."
    )


def _gpt_evaluate(lm, inputs, labels):
    result = lm.evaluate(
        {"token_ids": inputs, "padding_mask": np.ones_like(inputs, bool)},
        labels,
        batch_size=64,
        verbose=0,
        return_dict=True,
    )
    return {"perplexity": float(result["perplexity"]), "accuracy": float(result["accuracy"])}


# === bert_stdlib: masked-token prediction on the same corpus =================================

BERT_LENGTH = 128
BERT_EVAL_CHUNKS = 256


def line_chunks(tokenizer, texts, max_tokens=BERT_LENGTH - 2):
    """Consecutive lines of each file joined while they fit in `max_tokens` WordPiece tokens ([CLS] and [SEP] aside)."""
    chunks = []
    for text in texts:
        lines = [line for line in text.split("\n") if line.strip()]
        counts = [len(ids) for ids in tokenizer.tokenize(lines)]
        current, size = [], 0
        for line, count in zip(lines, counts):
            if current and size + count > max_tokens:
                chunks.append("\n".join(current))
                current, size = [], 0
            current.append(line)
            size += count
        if current:
            chunks.append("\n".join(current))
    return chunks


def bert_eval_data(tokenizer):
    """The first 256 held-out chunks, 15% of their tokens all replaced by [MASK], drawn with EVAL_SEED.

    Returns (inputs, labels, weights) as `BertMaskedLMPreprocessor` gives them: numpy, the same on every backend.
    """
    preprocessor = kt.models.BertMaskedLMPreprocessor(
        tokenizer,
        sequence_length=BERT_LENGTH,
        mask_token_rate=1.0,
        random_token_rate=0.0,
        seed=EVAL_SEED,
        truncate=True,
    )
    return preprocessor(line_chunks(tokenizer, stdlib_texts("held_out"))[:BERT_EVAL_CHUNKS])


def train_bert_stdlib(steps=600, batch_size=32):
    train_texts = stdlib_texts("train")
    tokenizer = kt.tokenizers.WordPieceTokenizer.train(train_texts, vocabulary_size=2048)
    chunks = line_chunks(tokenizer, train_texts)
    chunks = [chunks[i] for i in np.random.default_rng(SEED).permutation(len(chunks))[: steps * batch_size]]
    preprocessor = kt.models.BertMaskedLMPreprocessor(tokenizer, sequence_length=BERT_LENGTH, seed=SEED, truncate=True)
    backbone = kt.models.BertBackbone(
        vocabulary_size=tokenizer.vocabulary_size,
        num_layers=2,
        num_heads=2,
        hidden_dim=128,
        intermediate_dim=512,
        max_sequence_length=BERT_LENGTH,
        dropout=0.0,
    )
    lm = kt.models.BertMaskedLM(backbone, preprocessor)
    lm.compile(optimizer=_adamw(2e-3, steps))
    eval_inputs, eval_labels, eval_weights = bert_eval_data(tokenizer)
    baseline = _bert_evaluate(kt.models.BertMaskedLM(_clone(backbone)), eval_inputs, eval_labels, eval_weights)
    start = time.time()
    x, y, w = preprocessor(chunks)  # 80% [MASK], 10% random token, 10% unchanged, as BERT
    lm.fit(x, y, sample_weight=w, batch_size=batch_size, epochs=1, shuffle=False, verbose=2)
    train_seconds = time.time() - start
    metrics = _bert_evaluate(lm, eval_inputs, eval_labels, eval_weights)
    data = {
        "train": f"{len(train_texts)} files, {sum(map(len, train_texts)):,} characters, cut into chunks of whole "
        f"lines of at most {BERT_LENGTH - 2} tokens; trained on {len(chunks):,} chunks "
        f"(one pass, batch {batch_size}, {steps} steps, 15% of tokens selected: 80% [MASK], "
        "10% random, 10% kept)",
        "eval": f"the first {BERT_EVAL_CHUNKS} chunks of the held-out files, 15% of tokens replaced by [MASK] with "
        f"seed {EVAL_SEED} ({int(eval_weights.sum()):,} masked tokens)",
    }
    write_preset(
        lm,
        "bert_stdlib",
        "BERT-style encoder trained on the Python standard library (masked LM): "
        "2 layers, d 128, 2 heads, WordPiece 2048.",
        data,
        metrics,
        baseline,
        train_seconds,
        {
            "eval_data_sha256": fingerprint(eval_inputs["token_ids"], eval_labels, eval_weights),
            "masked_tokens": int(eval_weights.sum()),
        },
    )


def _bert_evaluate(lm, inputs, labels, weights):
    result = lm.evaluate(inputs, labels, sample_weight=weights, batch_size=64, verbose=0, return_dict=True)
    return {"accuracy": float(result["accuracy"]), "perplexity": float(result["perplexity"])}


# === t5_reverse: reverse a sequence of digits ===============================================

T5_LENGTHS = (3, 12)  # digits per sequence, both ends included
T5_EVAL_EXAMPLES = 500


def digit_sequences(rng, count):
    """`count` strings of T5_LENGTHS[0] to T5_LENGTHS[1] random digits separated by spaces."""
    lengths = rng.integers(T5_LENGTHS[0], T5_LENGTHS[1] + 1, size=count)
    return [" ".join(map(str, rng.integers(0, 10, size=n))) for n in lengths]


def reverse(text):
    return " ".join(text.split()[::-1])


def t5_eval_data():
    """500 held-out sources and their reversals (drawn with EVAL_SEED; never in the training set)."""
    sources = digit_sequences(np.random.default_rng(EVAL_SEED), T5_EVAL_EXAMPLES)
    return sources, [reverse(s) for s in sources]


def train_t5_reverse(steps=5000, batch_size=64):
    eval_sources, eval_targets = t5_eval_data()
    held_out = set(eval_sources)
    sources = [s for s in digit_sequences(np.random.default_rng(SEED), steps * batch_size + 5000) if s not in held_out]
    sources = sources[: steps * batch_size]
    # One piece per digit ("▁7"), so a reversal is a reversal of tokens.
    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)] + [(f"\u2581{d}", -2.3) for d in range(10)]
    tokenizer = kt.tokenizers.UnigramTokenizer.from_vocabulary(pieces)
    preprocessor = kt.models.T5Seq2SeqLMPreprocessor(tokenizer, encoder_sequence_length=16, decoder_sequence_length=16)
    backbone = kt.models.T5Backbone(
        vocabulary_size=tokenizer.vocabulary_size,
        num_layers=2,
        num_heads=4,
        hidden_dim=64,
        intermediate_dim=256,
        key_dim=16,
        dropout=0.0,
        relative_attention_num_buckets=64,
        relative_attention_max_distance=64,
    )
    lm = kt.models.T5Seq2SeqLM(backbone, preprocessor)
    lm.compile(optimizer=_adamw(3e-3, steps))
    baseline = t5_exact_match(kt.models.T5Seq2SeqLM(_clone(backbone), preprocessor), eval_sources, eval_targets)
    start = time.time()
    x, y, w = preprocessor((sources, [reverse(s) for s in sources]))
    lm.fit(x, y, sample_weight=w, batch_size=batch_size, epochs=1, shuffle=False, verbose=2)
    train_seconds = time.time() - start
    metrics = t5_exact_match(lm, eval_sources, eval_targets)
    examples = lm.generate(eval_sources[:3], max_new_tokens=T5_LENGTHS[1] + 1, sampler="greedy")
    data = {
        "train": f"{len(sources):,} random sequences of {T5_LENGTHS[0]} to {T5_LENGTHS[1]} digits (seed {SEED}), "
        f"the held-out ones removed; one pass, batch {batch_size}, {steps} steps",
        "eval": f"{T5_EVAL_EXAMPLES} sequences drawn with seed {EVAL_SEED}, none seen in training; greedy `generate`, "
        f"exact match of the whole output",
    }
    sample_text = "Greedy outputs on held-out sources:\n\n" + "\n".join(
        f"- `{s}` -> `{o}`" for s, o in zip(eval_sources, examples)
    )
    write_preset(
        lm,
        "t5_reverse",
        "T5-style encoder-decoder trained to reverse digit sequences (3 to 12 digits): 2+2 layers, d 64, 4 heads.",
        data,
        metrics,
        baseline,
        train_seconds,
        {"eval_data_sha256": fingerprint(np.array(eval_sources + eval_targets))},
        sample_text,
    )


def t5_exact_match(lm, sources, targets):
    outputs = lm.generate(sources, max_new_tokens=T5_LENGTHS[1] + 1, sampler="greedy")
    return {"exact_match": float(np.mean([o == t for o, t in zip(outputs, targets)]))}


# === shared =================================================================================


def _adamw(peak, steps):
    schedule = keras.optimizers.schedules.CosineDecay(
        0.0, decay_steps=steps - steps // 10, alpha=0.1, warmup_target=peak, warmup_steps=steps // 10
    )
    return keras.optimizers.AdamW(learning_rate=schedule, weight_decay=0.01, clipnorm=1.0)


def _clone(backbone):
    """The same architecture with fresh random weights (the baseline a trained preset must beat)."""
    return type(backbone).from_config(backbone.get_config())


def write_preset(task, name, description, data, metrics, baseline, train_seconds, extra, sample_text=""):
    """save_to_preset, then the registry fields, metrics.json and the model card."""
    folder = ZOO / name
    task.save_to_preset(folder)
    if len(task.weights) == len(task.backbone.weights):  # tied head: task.weights.h5 would duplicate the backbone's
        (folder / "task.weights.h5").unlink()
    config = json.loads((folder / "config.json").read_text())
    config = {"name": name, "description": description, **config}
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    weight_bytes = sum(f.stat().st_size for f in folder.glob("*.weights.h5"))
    record = {
        "metrics": {k: round(v, 6) for k, v in metrics.items()},
        "random_init": {k: round(v, 6) for k, v in baseline.items()},
        "eval": data["eval"],
        **extra,
        "backend": keras.config.backend(),
        "python": platform.python_version(),
        "stdlib_files": len(stdlib_files()[1]),
        "train_seconds": round(train_seconds, 1),
        "parameter_count": config["parameter_count"],
        "weights_bytes": weight_bytes,
    }
    (folder / "metrics.json").write_text(json.dumps(record, indent=2) + "\n")
    rows = "\n".join(f"| {k} | {metrics[k]:.4f} | {baseline[k]:.4f} |" for k in metrics)
    card = f"""# {name}

{description}

Trained weights, written by `tools/train_presets.py` (fixed seeds); `tests/test_trained_presets.py` re-measures the
held-out metrics below on TensorFlow, JAX and PyTorch.

- parameters: {config["parameter_count"]:,}; weights: {weight_bytes / 1e6:.1f} MB (float32)
- training data: {data["train"]}
- held-out data: {data["eval"]}
- trained on: KERAS_BACKEND={keras.config.backend()}, {os.cpu_count()} CPU cores, Python {platform.python_version()},
  Keras {keras.__version__}; training took {train_seconds / 60:.1f} min (wall clock, on a shared machine)
- command: `KERAS_BACKEND={keras.config.backend()} python tools/train_presets.py {name}`

## Held-out metrics

| metric | trained | same architecture, random init |
|---|---:|---:|
{rows}

Machine-readable: `metrics.json`.

{sample_text}

## Use

```python
import keras_transformer as kt

lm = kt.models.{type(task).__name__}.from_preset("{name}")
```
"""
    (folder / "README.md").write_text(card.replace("\n\n\n", "\n\n"))
    print(json.dumps(record, indent=2))


# === quantized weights: the same held-out metrics after Keras's `task.quantize` =============

QUANTIZATION_MODES = ("int8", "int4")
QUANTIZED = ("gpt_stdlib", "llama_stdlib", "bert_stdlib")  # the presets whose cards give perplexity
QUANTIZED_CHECK_ROWS = 64  # tests/test_trained_presets.py re-measures the quantized metrics on this many first rows
_QUANTIZED_HEADING = "### After `task.quantize`"


def quantized_task(name, mode):
    """The trained preset `name` with Keras's `task.quantize(mode)` applied, and its held-out data (as the card's)."""
    if name == "bert_stdlib":
        lm = kt.models.BertMaskedLM.from_preset(name)
        data = bert_eval_data(lm.preprocessor.tokenizer)
    else:
        lm = kt.models.CausalLM.from_preset(name)
        data = gpt_eval_data(lm.preprocessor.tokenizer)
    lm.quantize(mode)
    return lm, data


def first_rows(data, count):
    """The first `count` windows (chunks) of held-out data: a tuple of arrays or of dicts of arrays."""
    return tuple({k: v[:count] for k, v in part.items()} if isinstance(part, dict) else part[:count] for part in data)


def write_quantized_metrics(name):
    """Measure the held-out metrics of the trained preset `name` after int8 and int4 quantization and add them to
    its metrics.json and model card (the trained weights and the float32 metrics stay as they are)."""
    folder = ZOO / name
    evaluate = _bert_evaluate if name == "bert_stdlib" else _gpt_evaluate
    quantized = {}
    for mode in QUANTIZATION_MODES:
        lm, data = quantized_task(name, mode)
        quantized[mode] = {k: round(v, 6) for k, v in evaluate(lm, *data).items()}
        first = evaluate(lm, *first_rows(data, QUANTIZED_CHECK_ROWS))  # what the test re-measures, in less time
        quantized[mode][f"first_{QUANTIZED_CHECK_ROWS}"] = {k: round(v, 6) for k, v in first.items()}
    record = json.loads((folder / "metrics.json").read_text())
    record["quantized"] = {**quantized, "backend": keras.config.backend()}
    (folder / "metrics.json").write_text(json.dumps(record, indent=2) + "\n")
    rows = "\n".join(
        f"| {k} | {v:.4f} | "
        + " | ".join(f"{quantized[m][k]:.4f} ({quantized[m][k] / v - 1:+.2%})" for m in QUANTIZATION_MODES)
        + " |"
        for k, v in record["metrics"].items()
    )
    head = ", the masked-LM head's dense layer" if name == "bert_stdlib" else ""
    section = f"""{_QUANTIZED_HEADING}

The same weights after Keras's own quantization, `task.quantize("int8")` or `task.quantize("int4")` with Keras's
defaults: the Dense / EinsumDense kernels (attention and feed-forward projections{head}) become int8 per output
channel, with the activations quantized per token on the fly, or int4 in blocks of 128 inputs; the embedding tables,
and the output head that reads the token table, stay float32. Same held-out data; measured by
`KERAS_BACKEND={keras.config.backend()} python tools/train_presets.py --quantized {name}`.

| metric | float32 | int8 | int4 |
|---|---:|---:|---:|
{rows}

"""
    card = (folder / "README.md").read_text()
    start = card.find(_QUANTIZED_HEADING)
    anchor = card.index("Machine-readable: `metrics.json`.")
    card = card[: start if start >= 0 else anchor] + section + card[anchor:]
    (folder / "README.md").write_text(card)
    print(json.dumps(record["quantized"], indent=2))


RECIPES = {
    "gpt_stdlib": train_gpt_stdlib,
    "llama_stdlib": train_llama_stdlib,
    "llama_stdlib_draft": train_llama_stdlib_draft,
    "moe_stdlib": train_moe_stdlib,
    "bert_stdlib": train_bert_stdlib,
    "t5_reverse": train_t5_reverse,
}

if __name__ == "__main__":
    # `--quantized NAME...`: only (re)measure the quantized metrics of trained presets, without training.
    quantized_only = sys.argv[1:2] == ["--quantized"]
    names = [n for n in sys.argv[1:] if n != "--quantized"] or (QUANTIZED if quantized_only else RECIPES)
    for recipe in names:
        keras.utils.set_random_seed(SEED)
        if not quantized_only:
            RECIPES[recipe]()
        if recipe in QUANTIZED:
            write_quantized_metrics(recipe)
