"""Token log-probabilities in OpenAI's response shapes.

An entry is what `sampling.token_logprobs` returns for one token: (its log-probability, the ids and
log-probabilities of the most likely tokens, most likely first), or None (an echoed prompt's first token,
which nothing scores). They are the log-softmax of the model's raw logits, before temperature, top-k/top-p
and any constraint (as OpenAI and vLLM report them by default).

Chat completions: `{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}],
"refusal": None}`. Completions: `{"tokens", "token_logprobs", "top_logprobs": [{token: logprob}] (the top N and
the chosen token: up to N + 1), "text_offset"}`.
"""

import asyncio

from sampling import token_logprobs


class TokenStrings:
    """Token ids -> (their text, their UTF-8 bytes), special tokens included, worked out once per id.

    A token that holds part of a character (byte-level BPE) decodes to U+FFFD; its text is then OpenAI's
    `bytes:\\xNN...` form of its own bytes, so that two such tokens never share a name."""

    def __init__(self, tokenizer):
        self.tokenizer, self.cache = tokenizer, {}

    def __call__(self, token):
        return self.entry(token)[0]

    def entry(self, token):
        found = self.cache.get(token)
        if found is None:
            text = self.tokenizer.decode([token], skip_special_tokens=False)
            raw = text.encode()
            if "\ufffd" in text:
                raw = _token_bytes(self.tokenizer.id_to_token(token)) or raw
                text = "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
            found = self.cache[token] = (text, list(raw))
        return found


def _byte_level_alphabet():
    """GPT-2's byte-level BPE alphabet: the printable character standing for each byte -> that byte."""
    kept = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    shifted = [b for b in range(256) if b not in kept]
    return {**{chr(b): b for b in kept}, **{chr(256 + n): b for n, b in enumerate(shifted)}}


_BYTE_LEVEL = _byte_level_alphabet()


def _token_bytes(piece):
    """A vocabulary entry's bytes: a byte-fallback piece `<0xNN>`, or a byte-level BPE piece; else None."""
    if piece is None:
        return None
    if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
        return bytes([int(piece[3:5], 16)])
    if all(c in _BYTE_LEVEL for c in piece):
        return bytes(_BYTE_LEVEL[c] for c in piece)
    return None


def chat_logprobs(strings, ids, entries):
    """A chat choice's tokens `ids` and their `entries` -> OpenAI's chat `logprobs` object."""
    content = []
    for token, (logprob, top_ids, top_values) in zip(ids, entries):
        text, raw = strings.entry(token)
        content.append(
            {
                "token": text,
                "logprob": logprob,
                "bytes": raw,
                "top_logprobs": [
                    {"token": strings(t), "logprob": v, "bytes": strings.entry(t)[1]}
                    for t, v in zip(top_ids, top_values)
                ],
            }
        )
    return {"content": content, "refusal": None}


def completion_logprobs(strings, ids, entries, offset=0):
    """A completion choice's tokens `ids` and their `entries` (None: not scored) -> OpenAI's completion
    `logprobs` object; `text_offset` counts characters of the token strings from `offset`."""
    tokens, token_logprobs_, top_logprobs, text_offset = [], [], [], []
    for token, entry in zip(ids, entries):
        text = strings(token)
        tokens.append(text)
        text_offset.append(offset)
        offset += len(text)
        if entry is None:
            token_logprobs_.append(None)
            top_logprobs.append(None)
            continue
        logprob, top_ids, top_values = entry
        token_logprobs_.append(logprob)
        top = {strings(t): v for t, v in zip(top_ids, top_values)}
        top.setdefault(text, logprob)  # the chosen token, always (as OpenAI: up to N + 1 entries)
        top_logprobs.append(top)
    return {
        "tokens": tokens,
        "token_logprobs": token_logprobs_,
        "top_logprobs": top_logprobs,
        "text_offset": text_offset,
    }


async def prompt_entries(generator, prompt_ids, top):
    """Each prompt's token entries, its first token None (`echo` with `logprobs`): the prefill graph's logits
    over the prompt (teacher forcing), on a thread of its own."""

    def score(ids):
        logits = generator.teacher_logits(ids)  # (T, V): row t scores token t + 1
        return [None] + [token_logprobs(logits[t - 1], ids[t], top) for t in range(1, len(ids))]

    return [await asyncio.to_thread(score, ids) for ids in prompt_ids]
