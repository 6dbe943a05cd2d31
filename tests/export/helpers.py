"""Tiny tasks of every family, independent Keras references for generation, and subprocess helpers.

The references here use only the tasks' full forward pass (no cache, no exporter code):
greedy and beam search are written out in plain Python over those logits.
"""

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import keras
import numpy as np

from keras_transformer.decoding.decode_loop import refresh_after

from keras_transformer.models import (
    BertBackbone,
    BertClassifier,
    BertTextClassifierPreprocessor,
    GemmaBackbone,
    GemmaCausalLM,
    GemmaCausalLMPreprocessor,
    GPTBackbone,
    GPTCausalLM,
    GPTCausalLMPreprocessor,
    LlamaBackbone,
    LlamaCausalLM,
    LlamaCausalLMPreprocessor,
    T5Backbone,
    T5Seq2SeqLM,
    T5Seq2SeqLMPreprocessor,
    TransformerBackbone,
    TransformerSeq2SeqLM,
    TransformerSeq2SeqLMPreprocessor,
)
from keras_transformer.export.onnx import RUNTIME_FILES, SHARED_FILES
from keras_transformer.tokenizers import BytePairTokenizer, UnigramTokenizer, WordPieceTokenizer

REPO = Path(__file__).resolve().parents[2]
# The runtime every ONNX bundle carries (export/runtime/'s files and the package's chat_template.py), written
# out here rather than read from the exporter, so that a bundle missing one fails the layout tests.
BUNDLE_RUNTIME_FILES = [
    "batching.py",
    "bundle_files.py",
    "cache_rows.py",
    "chat_template.py",
    "constraint.py",
    "decode_loop.py",
    "encoder.py",
    "generate.py",
    "generator.py",
    "prefix_cache.py",
    "prompt_lookup.py",
    "requirements.txt",
    "sampling.py",
    "sequence.py",
    "serve.py",
    "serve_constraints.py",
    "serve_endpoints.py",
    "serve_fields.py",
    "serve_logprobs.py",
    "serve_streaming.py",
    "serve_tools.py",
    "serve_validation.py",
]
CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "for i in range(10):\n    print(i)\n",
    "the quick brown fox jumps over the lazy dog",
    "translate english to german: the house is small",
] * 10
# What the runner must not import (and the SavedModel loader must not need).
FRAMEWORKS = ("keras", "keras_transformer", "tensorflow", "jax", "torch")


def to_numpy(x):
    return keras.ops.convert_to_numpy(x)


def randomize(task, seed=0, std=0.3):
    """Large random weights (norm scales around 1): peaked next-token distributions, so greedy and
    beam choices are far from ties and float32 round-off cannot flip them."""
    rng = np.random.default_rng(seed)
    for variable in task.weights:
        shape = tuple(variable.shape)
        if variable.path.endswith(("gamma", "scale")):
            values = 1.0 + 0.1 * rng.standard_normal(shape)
        else:
            values = std * rng.standard_normal(shape)
        variable.assign(values.astype("float32"))
    return task


def tiny_gpt(seed=0):
    tokenizer = BytePairTokenizer.train(CORPUS, vocabulary_size=300)
    backbone = GPTBackbone(
        tokenizer.vocabulary_size, num_layers=2, num_heads=2, hidden_dim=16, intermediate_dim=32, max_sequence_length=48
    )
    lm = randomize(GPTCausalLM(backbone, GPTCausalLMPreprocessor(tokenizer, sequence_length=32)), seed)
    # A larger end-token embedding (tied to the output): some rows stop early, exercising the stop logic.
    embeddings = to_numpy(backbone.token_embedding.embeddings)
    embeddings[tokenizer.eos_token_id] *= 3.0
    backbone.token_embedding.embeddings.assign(embeddings)
    return lm


def tiny_vocabulary_gpt(seed=0, num_layers=2, hidden_dim=16, vocabulary_size=5):
    """A GPT over a vocabulary of `vocabulary_size` ids and no tokenizer, with small weights (std 0.15): next-token
    distributions spread over every id, for tests that count draws in each cell."""
    backbone = GPTBackbone(
        vocabulary_size,
        num_layers=num_layers,
        num_heads=2,
        hidden_dim=hidden_dim,
        intermediate_dim=2 * hidden_dim,
        max_sequence_length=16,
    )
    return randomize(GPTCausalLM(backbone), seed, std=0.15)


def tiny_llama(seed=0):
    """Rotary GQA with Qwen2's biases, a separate head and a sliding window shorter than the prompts + new tokens."""
    tokenizer = BytePairTokenizer.train(CORPUS, vocabulary_size=300)
    backbone = LlamaBackbone(
        tokenizer.vocabulary_size,
        num_layers=2,
        num_heads=4,
        num_key_value_heads=2,
        hidden_dim=16,
        intermediate_dim=32,
        max_sequence_length=48,
        attention_bias=True,
        attention_output_bias=False,
        tie_word_embeddings=False,
        sliding_window=6,
        rope_scaling={"rope_type": "linear", "factor": 2.0},
    )
    lm = randomize(LlamaCausalLM(backbone, LlamaCausalLMPreprocessor(tokenizer, sequence_length=32)), seed)
    head = to_numpy(backbone.token_embedding.reverse_embeddings)  # (D, V)
    head[:, tokenizer.eos_token_id] *= 3.0  # some rows stop early, as tiny_gpt's
    backbone.token_embedding.reverse_embeddings.assign(head)
    return lm


def tiny_gemma(seed=0):
    """Gemma 3's layout with Gemma 2's soft caps: four (1 + w) norms per block, per-head query/key norms, a local
    layer (window 6, its own rotary base) then a global one, query_pre_attn_scalar not the head size, tied head."""
    tokenizer = BytePairTokenizer.train(CORPUS, vocabulary_size=300)
    backbone = GemmaBackbone(
        tokenizer.vocabulary_size,
        num_layers=2,
        num_heads=4,
        num_key_value_heads=2,
        hidden_dim=16,
        intermediate_dim=32,
        max_sequence_length=48,
        query_pre_attn_scalar=6.0,
        local_rope_max_wavelength=100.0,
        sliding_window=6,
        layer_types=["sliding_attention", "full_attention"],
        query_key_norm="head",
        attention_logit_soft_cap=8.0,
        final_logit_soft_cap=20.0,
    )
    return randomize(GemmaCausalLM(backbone, GemmaCausalLMPreprocessor(tokenizer, sequence_length=32)), seed)


def tiny_phi3(seed=0):
    """Phi-3 / Phi-4-mini's layout: half of each head rotating, longrope with an original length (6) that the
    shortest prompt's generation crosses (every runtime then computes the cache again, as transformers' generate
    does, and gives the full forward pass's tokens: see convert/hf_phi3.py) and the longer prompts pass, tied
    head."""
    tokenizer = BytePairTokenizer.train(CORPUS, vocabulary_size=300)
    backbone = LlamaBackbone(
        tokenizer.vocabulary_size,
        num_layers=2,
        num_heads=4,
        num_key_value_heads=2,
        hidden_dim=32,
        intermediate_dim=32,
        max_sequence_length=48,
        rotary_dim=4,
        rope_scaling={
            "rope_type": "longrope",
            "short_factor": [1.0, 1.5],
            "long_factor": [2.0, 5.0],
            "original_max_position_embeddings": 6,
            "attention_factor": 1.2,
        },
    )
    return randomize(LlamaCausalLM(backbone, LlamaCausalLMPreprocessor(tokenizer, sequence_length=32)), seed)


def tiny_moe(seed=0):
    """A dense layer, then a sparse mixture of experts (Mixtral's / Qwen3-MoE's layout: the top 2 of 4 SwiGLU
    experts, renormalised), tied head. Heads of 16 dims (GroupQueryAttention's CPU rotary needs a multiple of 16):
    the bundle's graphs are the ONNX kernels', not traced."""
    tokenizer = BytePairTokenizer.train(CORPUS, vocabulary_size=300)
    backbone = LlamaBackbone(
        tokenizer.vocabulary_size,
        num_layers=2,
        num_heads=2,
        num_key_value_heads=1,
        hidden_dim=32,
        intermediate_dim=32,
        max_sequence_length=48,
        mixture_of_experts={"num_experts": 4, "top_k": 2, "intermediate_dim": 16},
        moe_layers=[False, True],
    )
    return randomize(LlamaCausalLM(backbone, LlamaCausalLMPreprocessor(tokenizer, sequence_length=32)), seed)


# Shared by `make test`'s three pytest processes (one per backend): tokenizers and exports (tests/export/conftest.py).
TEST_CACHE = Path(tempfile.gettempdir()) / "keras_transformer_test_exports"


def shared_tokenizer(cls, vocabulary_size):
    """`cls.train(CORPUS, vocabulary_size)`, trained once per machine: WordPiece and Unigram training is not
    deterministic across processes (ties broken in hash order), and the same task on every backend lets the
    backends share one export of it."""
    key = hashlib.sha256(json.dumps([cls.__name__, vocabulary_size, CORPUS]).encode()).hexdigest()[:32]
    file = TEST_CACHE / f"tokenizer-{key}.json"
    if file.is_file():
        return cls.from_config(json.loads(file.read_text()))
    tokenizer = cls.train(CORPUS, vocabulary_size=vocabulary_size)
    TEST_CACHE.mkdir(parents=True, exist_ok=True)
    staging = file.with_suffix(f".{os.getpid()}.tmp")
    staging.write_text(json.dumps(tokenizer.to_config()))
    os.replace(staging, file)
    return tokenizer


def tiny_bert_classifier(seed=0):
    tokenizer = shared_tokenizer(WordPieceTokenizer, 120)
    backbone = BertBackbone(
        tokenizer.vocabulary_size,
        num_layers=2,
        num_heads=2,
        hidden_dim=16,
        intermediate_dim=32,
        max_sequence_length=32,
        dropout=0.0,
    )
    preprocessor = BertTextClassifierPreprocessor(tokenizer, sequence_length=16)
    return randomize(BertClassifier(backbone, num_classes=3, preprocessor=preprocessor, dropout=0.0), seed)


def tiny_t5(seed=0):
    tokenizer = shared_tokenizer(UnigramTokenizer, 80)
    backbone = T5Backbone(
        tokenizer.vocabulary_size, num_layers=2, num_heads=2, hidden_dim=16, intermediate_dim=32, dropout=0.0
    )
    preprocessor = T5Seq2SeqLMPreprocessor(tokenizer, encoder_sequence_length=48, decoder_sequence_length=16)
    return randomize(T5Seq2SeqLM(backbone, preprocessor), seed)


def tiny_transformer(seed=0):
    tokenizer = BytePairTokenizer.train(CORPUS, vocabulary_size=300)
    backbone = TransformerBackbone(
        tokenizer.vocabulary_size,
        num_layers=1,
        num_heads=2,
        hidden_dim=16,
        intermediate_dim=32,
        max_sequence_length=48,
        dropout=0.0,
    )
    preprocessor = TransformerSeq2SeqLMPreprocessor(tokenizer, encoder_sequence_length=48, decoder_sequence_length=16)
    return randomize(TransformerSeq2SeqLM(backbone, preprocessor), seed)


# --- references over the full forward pass ----------------------------------


def _log_softmax(logits):
    logits = np.asarray(logits, np.float64)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def causal_next_logits(lm, batch_size=4):
    """sequences (equal lengths) -> logits of the next token (B, V), from the full forward pass.

    Sequences are right-padded to the model's length and batches to `batch_size`, so the
    compiled predict function sees one shape (causal attention: padding after a position
    cannot change its logits). Not for a model whose layers compute otherwise past a length N
    (longrope: `refresh_after`), where a forward pass's length picks the factors: its sequences
    run at their own length.
    """
    length = lm.backbone.max_sequence_length if refresh_after(lm.backbone) is None else None

    def next_logits(sequences):
        sequences = [list(s) for s in sequences]
        logits = []
        for start in range(0, len(sequences), batch_size):
            chunk = sequences[start : start + batch_size]
            ids, mask = _pad(chunk, length or len(chunk[0]), batch_size)
            out = lm.predict_on_batch({"token_ids": ids, "padding_mask": mask})
            logits += [out[i, len(s) - 1] for i, s in enumerate(chunk)]
        return np.stack(logits)

    return next_logits


def seq2seq_next_logits(task, source_ids, batch_size=4, length=16):
    """decoder sequences of one source -> next-token logits (B, V), from the full forward pass (padded as above)."""

    def next_logits(sequences):
        sequences = [list(s) for s in sequences]
        logits = []
        for start in range(0, len(sequences), batch_size):
            chunk = sequences[start : start + batch_size]
            ids, mask = _pad(chunk, length, batch_size)
            out = task.predict_on_batch(
                {
                    "encoder_token_ids": np.repeat(np.asarray([source_ids], "int32"), batch_size, 0),
                    "encoder_padding_mask": np.ones((batch_size, len(source_ids)), bool),
                    "decoder_token_ids": ids,
                    "decoder_padding_mask": mask,
                }
            )
            logits += [out[i, len(s) - 1] for i, s in enumerate(chunk)]
        return np.stack(logits)

    return next_logits


def _pad(sequences, length, batch_size):
    ids = np.zeros((batch_size, length), "int32")
    mask = np.zeros((batch_size, length), bool)
    for i, sequence in enumerate(sequences):
        if len(sequence) > length:
            raise ValueError(f"reference sequence longer than {length}")
        ids[i, : len(sequence)] = sequence
        mask[i, : len(sequence)] = True
    return ids, mask


def reference_greedy(next_logits, prefix, max_new_tokens, eos):
    """One row: argmax of the next-token logits, step by step; stops after the end token."""
    sequence, new = list(prefix), []
    for _ in range(max_new_tokens):
        token = int(np.argmax(next_logits([sequence])[0]))
        sequence.append(token)
        new.append(token)
        if token == eos:
            break
    return new


def bundle_generator(bundle):
    """The bundle's own Keras-free runner: its generate.py imported from the bundle, as when the bundle runs
    (then forgotten, so that the next bundle's copy is imported afresh) -> its `Generator(bundle)`."""
    names = [Path(name).stem for name in (*RUNTIME_FILES, *SHARED_FILES) if name.endswith(".py")]
    before = {name: sys.modules.pop(name) for name in names if name in sys.modules}  # this bundle's copies, not those
    sys.path.insert(0, str(bundle))
    try:
        import generate
    finally:
        sys.path.remove(str(bundle))
        for name in names:
            sys.modules.pop(name, None)
        sys.modules.update(before)
    return generate.Generator(bundle)


def runtime_module(name="decode_loop"):
    """A module of the Keras-free runner (export/runtime/NAME.py: by default the decoding loop), imported from
    the source tree with its directory on sys.path, as the runner's modules import one another."""
    import importlib.util

    directory = str(REPO / "export" / "runtime")
    sys.path.insert(0, directory)
    try:
        spec = importlib.util.spec_from_file_location(f"_runtime_{name}", REPO / "export" / "runtime" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(directory)
    return module


def runtime_noise():
    """The numpy noise of the Keras-free runner (export/runtime/sampling.py): (seed, step, rows) -> (R,)."""
    return runtime_module("sampling").uniform_noise


def reference_random(next_logits, prefix, max_new_tokens, eos, seed, row, temperature=1.0, top_k=None, top_p=None):
    """One row (row `row` of its batch): temperature, top-k, top-p (sorted nucleus), then inverse-CDF
    sampling with the noise of (seed, position, row); stops after the end token."""
    noise = runtime_noise()
    sequence, new = list(prefix), []
    for _ in range(max_new_tokens):
        logits = next_logits([sequence])[0].astype(np.float64) / temperature
        if top_k is not None:
            logits = np.where(logits < np.sort(logits)[::-1][top_k - 1], -np.inf, logits)
        probabilities = np.exp(logits - logits.max())
        probabilities /= probabilities.sum()
        if top_p is not None:
            order = np.argsort(-probabilities, kind="stable")
            before = np.cumsum(probabilities[order]) - probabilities[order]  # mass of the more likely tokens
            keep = np.zeros(len(logits), bool)
            keep[order[before < top_p]] = True
            probabilities = np.where(keep, probabilities, 0.0)
        cdf = np.cumsum(probabilities)
        uniform = noise(seed, len(sequence), row + 1)[row]
        token = int(np.flatnonzero((cdf >= uniform * cdf[-1]) & (probabilities > 0))[0])
        sequence.append(token)
        new.append(token)
        if token == eos:
            break
    return new


def reference_beam(next_logits, prefix, max_new_tokens, eos, num_beams, length_penalty=1.0):
    """One input: Hugging Face's beam search (early_stopping=False) -> the best hypothesis' new tokens.

    Every step ranks the best 2K continuations of the running beams; those in the top K that
    end in `eos` (or reach max_new_tokens) join the store of K finished hypotheses, scored
    sum_logprob / new_length ** length_penalty; the best K others run on. The search stops when
    the best running beam (at its current length) cannot beat the worst of a full store.
    """
    beams, finished = [(list(prefix), 0.0)], []  # (tokens, summed log-probability); (score, tokens)
    for step in range(1, max_new_tokens + 1):
        scores = _log_softmax(next_logits([tokens for tokens, _ in beams]))  # (K, V)
        candidates = sorted(
            (
                (score + scores[k, v], tokens + [v])
                for k, (tokens, score) in enumerate(beams)
                for v in range(scores.shape[1])
            ),
            key=lambda c: -c[0],
        )[: 2 * num_beams]
        running = []
        for rank, (score, tokens) in enumerate(candidates):
            if tokens[-1] == eos or step == max_new_tokens:
                if rank < num_beams:
                    finished.append((score / step**length_penalty, tokens))
            elif len(running) < num_beams:
                running.append((tokens, score))
        finished = sorted(finished, key=lambda f: -f[0])[:num_beams]
        beams = running
        if step == max_new_tokens or (
            len(finished) == num_beams and beams[0][1] / step**length_penalty <= finished[-1][0]
        ):
            break
    return finished[0][1][len(prefix) :]


# --- processes ----------------------------------------------------------------


def run_python(code, *args, env=None, timeout=300):
    """Run `code` in a fresh interpreter (cwd: the repository); returns the JSON it prints last."""
    environment = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **(env or {})}
    result = subprocess.run(
        [sys.executable, "-c", code, *map(str, args)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=environment,
        timeout=timeout,
    )
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return json.loads(result.stdout.strip().splitlines()[-1])
