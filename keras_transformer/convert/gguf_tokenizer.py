"""The tokenizer a GGUF file describes in its metadata, as a `tokenizers` pipeline, and ours written back as metadata.

A GGUF holds no tokenizer.json: `tokenizer.ggml.*` gives the model (`gpt2`: byte-level BPE, Llama 3 / Qwen / GPT-2
style; `llama`: SentencePiece BPE with byte fallback, Llama 2 / Mistral style), the tokens in id order, the merges
(or, for SentencePiece, scores that order them), token types, the special ids, `add_bos_token` and the chat
template. The pipeline built here is the one transformers' GGUF tokenizer builds from the same file
(`transformers.integrations.gguf.gguf_tokenizer_mapping`), so both give the same ids:
- `gpt2`: the tokens as spelled (a token outside the byte alphabet respelled byte by byte), the file's merges,
  byte-level pre-tokenization with the split that `tokenizer.ggml.pre` names (GPT-2's own without one we know);
- `llama`: the tokens, the file's merges or merges recovered from the scores (transformers' `generate_merges`),
  a Metaspace pre-tokenizer ("▁", prepended to the first word), byte fallback; Phi-3 prepends "▁" and replaces
  spaces in a normalizer instead (text starting with a space keeps one more "▁"), as its tokenizer.json does;
  Gemma 3's merges follow the tokens' order, with no prefix space (`_gemma`);
- control tokens (type 3) are special added tokens, user-defined ones (type 4) plain added tokens.
Any other tokenizer model is refused by name, as is a `tokenizer.ggml.pre` split we do not know.

Written back (`write_tokenizer`, the GGUF export's): a byte-level BPE as `gpt2` (tokens, merges, the split's name),
a BPE with byte fallback as `llama` (tokens, scores from the merges' ranks, token types), as llama.cpp's converter
writes them from the same vocabulary.
"""

import json
import re

import tokenizers
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers

from keras_transformer import tokenizers as kt_tokenizers

MODELS = ("gpt2", "llama")
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, BYTE = 1, 2, 3, 4, 6  # llama.cpp's token types
_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# tokenizer.ggml.pre -> the split regex of its byte-level pre-tokenizer; None: GPT-2's own (ByteLevel's regex).
PRE_TOKENIZERS = {
    "default": None,
    "gpt-2": None,
    "smollm": None,
    "llama3": _LLAMA3_SPLIT,
    "llama-v3": _LLAMA3_SPLIT,
    "llama-bpe": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT,
    "deepseek-r1-qwen": _QWEN2_SPLIT,
}


def read_tokenizer(checkpoint):
    """The checkpoint's tokenizer as a keras_transformer `BytePairTokenizer`, or None when it has no vocabulary."""
    model = checkpoint.value("tokenizer.ggml.model")
    if model is None:
        return None
    if model not in MODELS:
        raise ValueError(
            f"Unsupported GGUF tokenizer.ggml.model={model!r} in {checkpoint.path}: keras_transformer reads "
            f"{', '.join(MODELS)}."
        )
    if checkpoint.value("tokenizer.ggml.add_eos_token", False):
        raise ValueError(
            f"Unsupported GGUF tokenizer.ggml.add_eos_token=True in {checkpoint.path}: keras_transformer's causal LM "
            "preprocessors add no end token to a prompt."
        )
    tokens = list(checkpoint.value("tokenizer.ggml.tokens"))
    types = list(checkpoint.value("tokenizer.ggml.token_type", [NORMAL] * len(tokens)))
    merges = checkpoint.value("tokenizer.ggml.merges")
    if model == "gpt2":
        backend = _byte_level(checkpoint, tokens, merges)
    elif checkpoint.architecture == "gemma3":
        backend = _gemma(tokens, checkpoint.value("tokenizer.ggml.unknown_token_id"))
    else:
        scores = checkpoint.value("tokenizer.ggml.scores")
        backend = _sentencepiece(tokens, merges, scores, checkpoint.value("tokenizer.ggml.add_space_prefix", True))
        if checkpoint.architecture == "phi3":  # its prefix space from a normalizer, as Phi-3's tokenizer.json
            backend.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
            backend.pre_tokenizer = None
    _add_special(backend, tokens, types, byte_level=model == "gpt2")
    special = _special_tokens(checkpoint, tokens)
    tokenizer = kt_tokenizers.BytePairTokenizer(
        backend, chat_template=checkpoint.value("tokenizer.chat_template"), **special
    )
    tokenizer.source = str(checkpoint.path)
    return tokenizer


def _byte_level(checkpoint, tokens, merges):
    if merges is None:
        raise ValueError(f"The GGUF checkpoint {checkpoint.path} has a gpt2 tokenizer without tokenizer.ggml.merges.")
    pre = checkpoint.value("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise ValueError(
            f"Unsupported GGUF tokenizer.ggml.pre={pre!r} in {checkpoint.path}: keras_transformer knows the byte-level "
            f"splits of {', '.join(sorted(PRE_TOKENIZERS))}."
        )
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    spelling = _byte_spelling()
    vocab = {}
    for index, token in enumerate(tokens):
        spelled = token if set(token) <= set(alphabet) else "".join(spelling[b] for b in token.encode("utf-8"))
        vocab[spelled] = index
    model = models.BPE(vocab=vocab, merges=[tuple(merge.split(" ", 1)) for merge in merges], fuse_unk=False)
    backend = tokenizers.Tokenizer(model)
    split = PRE_TOKENIZERS[pre]
    if split is None:
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    backend.decoder = decoders.ByteLevel()
    return backend


def _byte_spelling():
    """GPT-2's byte -> printable character table (`bytes_to_unicode`)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    table, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            table[byte] = chr(byte)
        else:
            table[byte] = chr(256 + extra)
            extra += 1
    return table


def _sentencepiece(tokens, merges, scores, add_space_prefix):
    vocab = {token: index for index, token in enumerate(tokens)}
    if merges is not None:
        pairs = [tuple(merge.split(" ", 1)) for merge in merges]
    else:
        pairs = _merges_from_scores(vocab, dict(zip(tokens, scores if scores is not None else range(len(tokens)))))
    backend = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=True, byte_fallback=True))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement="▁", prepend_scheme="first" if add_space_prefix else "never", split=False
    )
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_space_prefix:
        steps.append(decoders.Strip(content=" ", left=1))
    backend.decoder = decoders.Sequence(steps)
    return backend


def _gemma(tokens, unknown_id):
    """Gemma's SentencePiece vocabulary as transformers' GGUF tokenizer builds it: a token of spaces only respelled
    with "▁" (the file stores real spaces), merges recovered by the tokens' order (Gemma's scores do not follow its
    merges), spaces made "▁" by a normalizer, no prefix space."""
    tokens = ["▁" * len(token) if " " in token and not token.strip() else token for token in tokens]
    vocab = {token: index for index, token in enumerate(tokens)}
    merges = _merges_from_scores(vocab, {token: -index for index, token in enumerate(tokens)})
    unknown = tokens[int(unknown_id)] if unknown_id is not None else None
    model = models.BPE(vocab=vocab, merges=merges, fuse_unk=True, unk_token=unknown, byte_fallback=True)
    backend = tokenizers.Tokenizer(model)
    backend.normalizer = normalizers.Replace(" ", "▁")
    backend.pre_tokenizer = pre_tokenizers.Split(pattern=" ", behavior="merged_with_previous", invert=False)
    backend.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    return backend


def _merges_from_scores(vocab, scores):
    """The merges a SentencePiece vocabulary implies: every split of a token into two tokens, best score first
    (ties: the shorter left piece, then the shorter right piece), as transformers' `generate_merges` orders them."""
    merges = []
    for token, score in scores.items():
        local = [
            (token[:i], token[i:], score) for i in range(1, len(token)) if token[:i] in vocab and token[i:] in vocab
        ]
        merges.extend(sorted(local, key=lambda m: (vocab[m[0]], vocab[m[1]])))
    merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [(left, right) for left, right, _ in merges]


def _add_special(backend, tokens, types, byte_level):
    alphabet = set(pre_tokenizers.ByteLevel.alphabet())
    control = [
        AddedToken(token, normalized=False, special=True)
        for token, kind in zip(tokens, types)
        if kind == CONTROL and (not byte_level or set(token) <= alphabet)
    ]
    if control:
        backend.add_special_tokens(control)
    vocab = backend.get_vocab()
    user = [
        AddedToken(token, normalized=False, special=False)
        for token, kind in zip(tokens, types)
        if kind == USER_DEFINED and token in vocab
    ]
    if user:
        backend.add_tokens(user)


def adds_start_token(checkpoint):
    """Whether a prompt starts with the start token: `tokenizer.ggml.add_bos_token`, by default true for a `llama`
    (SentencePiece) vocabulary and false for a `gpt2` one, as transformers' GGUF tokenizer reads the file."""
    return bool(checkpoint.value("tokenizer.ggml.add_bos_token", checkpoint.value("tokenizer.ggml.model") == "llama"))


def _special_tokens(checkpoint, tokens):
    """The special tokens by role (whether a prompt gets the start token is the preprocessor's `add_start_token`,
    `adds_start_token`); padding falls back to the end token."""
    special = {}
    for role, key in (("bos_token", "bos"), ("eos_token", "eos"), ("unk_token", "unknown"), ("pad_token", "padding")):
        token_id = checkpoint.value(f"tokenizer.ggml.{key}_token_id")
        if token_id is not None:
            if not 0 <= int(token_id) < len(tokens):
                raise ValueError(
                    f"The GGUF tokenizer.ggml.{key}_token_id={token_id} of {checkpoint.path} is outside its "
                    f"{len(tokens)} tokens."
                )
            special[role] = tokens[int(token_id)]
    special.setdefault("pad_token", special.get("eos_token"))
    return {role: special.get(role) for role in ("bos_token", "eos_token", "unk_token", "pad_token")}


# --- writing ----------------------------------------------------------------


def write_tokenizer(writer, tokenizer, add_bos):
    """Our tokenizer as `tokenizer.ggml.*` metadata on a `gguf.GGUFWriter`: a byte-level BPE as llama.cpp's `gpt2`
    model, a BPE with byte fallback (SentencePiece's, as the `llama` reader builds it) as its `llama` model."""
    backend = tokenizer.backend_tokenizer
    state = json.loads(backend.to_str())
    size = backend.get_vocab_size(with_added_tokens=True)
    by_id = {index: token for token, index in backend.get_vocab(with_added_tokens=True).items()}
    if sorted(by_id) != list(range(size)):
        raise ValueError("The tokenizer's ids are not 0..V-1 without gaps, which a GGUF token list needs.")
    tokens = [by_id[i] for i in range(size)]
    added = {entry["content"]: entry["special"] for entry in state["added_tokens"]}
    types = [(CONTROL if added[token] else USER_DEFINED) if token in added else NORMAL for token in tokens]
    merges = [merge if isinstance(merge, str) else " ".join(merge) for merge in state["model"]["merges"]]
    if state["model"]["type"] == "BPE" and "ByteLevel" in json.dumps(state["pre_tokenizer"]):
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre(_pre_name(state["pre_tokenizer"]))
        writer.add_token_list(tokens)
        writer.add_token_types(types)
        writer.add_token_merges(merges)
    elif state["model"]["type"] == "BPE" and state["model"].get("byte_fallback"):
        _write_sentencepiece(writer, state, tokens, types, merges)
    else:
        raise ValueError(
            f"Exporting to GGUF writes byte-level BPE tokenizers (llama.cpp's gpt2) and BPE with byte fallback "
            f"(SentencePiece's, llama.cpp's llama); this one is a {state['model']['type']} with pre-tokenizer "
            f"{json.dumps(state['pre_tokenizer'])[:120]}."
        )
    for role, add in (("bos", writer.add_bos_token_id), ("eos", writer.add_eos_token_id)):
        token_id = getattr(tokenizer, f"{role}_token_id")
        if token_id is not None:
            add(token_id)
    if tokenizer.pad_token_id is not None:
        writer.add_pad_token_id(tokenizer.pad_token_id)
    writer.add_add_bos_token(bool(add_bos))
    if tokenizer.chat_template is not None:
        writer.add_chat_template(tokenizer.chat_template)


def _write_sentencepiece(writer, state, tokens, types, merges):
    """llama.cpp's `llama` tokenizer model: tokens, scores and types. Its tokenizer merges the adjacent pair whose
    merged token scores highest, so a token's score is minus the rank of the first merge that makes it, which gives
    BPE's order back; the other normal tokens (characters) follow, in id order, and bytes and special tokens score 0.
    These are a SentencePiece BPE model's own scores (-0, -1, -2, ...: its pieces by merge rank, then its
    characters). Byte tokens <0xXX> are BYTE, the model's unknown token (or one spelled <unk>) UNKNOWN. The prefix
    space: a Metaspace pre-tokenizer that prepends, or a normalizer that prepends "▁" (Phi-3's); Gemma's has none."""
    unknown = state["model"].get("unk_token") or "<unk>"
    for index, token in enumerate(tokens):
        if re.fullmatch(r"<0x[0-9A-F]{2}>", token):
            types[index] = BYTE
        elif token == unknown:
            types[index] = UNKNOWN
    rank = {}
    for merge in merges:
        rank.setdefault(merge.replace(" ", "", 1), len(rank))
    scores, following = [], len(rank)
    for token, kind in zip(tokens, types):
        if token in rank:
            scores.append(-float(rank[token]))
        elif kind == NORMAL:
            scores.append(-float(following))
            following += 1
        else:
            scores.append(0.0)
    text = json.dumps([state["pre_tokenizer"], state["normalizer"]])
    prefix = '"prepend_scheme": "first"' in text or '"prepend_scheme": "always"' in text or '"Prepend"' in text
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    if not prefix:
        writer.add_add_space_prefix(False)


def _pre_name(pre_tokenizer):
    """The tokenizer.ggml.pre name of a byte-level pre-tokenizer: GPT-2's own, or a known split."""
    if pre_tokenizer.get("type") == "ByteLevel" and pre_tokenizer.get("use_regex", True):
        return "gpt-2"
    steps = pre_tokenizer.get("pretokenizers", [])
    pattern = steps[0].get("pattern", {}).get("Regex") if steps and steps[0].get("type") == "Split" else None
    for name in ("qwen2", "llama-bpe"):
        if PRE_TOKENIZERS[name] == pattern:
            return name
    raise ValueError(
        f"Exporting to GGUF: the tokenizer's pre-tokenizer {json.dumps(pre_tokenizer)[:160]} is none of the byte-level "
        "splits llama.cpp names (gpt-2, qwen2, llama-bpe)."
    )


__all__ = ["MODELS", "PRE_TOKENIZERS", "adds_start_token", "read_tokenizer", "write_tokenizer"]
