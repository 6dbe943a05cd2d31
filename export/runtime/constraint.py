"""Constrained decoding: a grammar (a JSON schema, a regex, a list of choices, a Lark or GBNF grammar) masks
each step's logits so that only tokens that keep the text inside the grammar can be chosen.

The grammar engine is llguidance (guidance-ai; Rust, no Python dependencies): it compiles the grammar
lazily and computes a step's token mask in tens of microseconds, which is why it was chosen over xgrammar
and outlines-core (benchmarks/RESULTS.md, "Constrained decoding"). A request's grammar is compiled and
checked once (`Grammars.compile`: an invalid schema, an unsupported keyword or a bad regex is a
`ValueError`); each sequence gets a matcher of its own (`Grammars.matcher`), which `sequence.choose` asks
for the mask before each token and tells the token chosen.

The bundle's stop tokens are the grammar's end: they are allowed exactly when the grammar accepts the text
so far, and they are all that is allowed once it can go no further. A mask never leaves no token: should the
matcher fail, the stop tokens are allowed (`sequence.choose`), and the sequence ends.

Axes: N rows, V vocabulary, W = ceil(V / 32) mask words.
"""

import json
import os
import threading

import numpy as np

try:
    import llguidance
    import llguidance.numpy as llguidance_numpy
except ModuleNotFoundError:  # the bundle serves unconstrained requests without it
    llguidance = llguidance_numpy = None

KINDS = ("json", "regex", "choice", "grammar", "lark")
# JSON as the model writes it: no whitespace between tokens (a model that may write any amount can spend
# every token it has on spaces), "," and ":" as separators.
JSON_OPTIONS = {"whitespace_flexible": False}


class Grammars:
    """Compiles grammars against one bundle's tokenizer (built on first use) and makes their matchers.

    Args:
        tokenizer_file: the bundle's tokenizer.json.
        vocabulary_size: V, the model's vocabulary (it may be larger than the tokenizer's).
        stop_token_ids: the ids that end a sequence: the grammar's end.
    """

    def __init__(self, tokenizer_file, vocabulary_size, stop_token_ids):
        self.tokenizer_file, self.vocabulary_size = tokenizer_file, int(vocabulary_size)
        self.stop_token_ids = tuple(int(t) for t in stop_token_ids)
        self._tokenizer, self._lock = None, threading.Lock()

    @property
    def tokenizer(self):
        with self._lock:
            if self._tokenizer is None:
                if llguidance is None:
                    raise ValueError("Constrained decoding needs the llguidance package: pip install llguidance")
                if not self.stop_token_ids:
                    raise ValueError(
                        "Constrained decoding needs a stop token (the grammar's end); this model has none."
                    )
                if not os.path.isfile(self.tokenizer_file):
                    raise ValueError(f"Constrained decoding needs the bundle's tokenizer.json: {self.tokenizer_file}")
                with open(self.tokenizer_file, encoding="utf-8") as file:
                    text = file.read()
                try:
                    self._tokenizer = llguidance.LLTokenizer(
                        text, n_vocab=self.vocabulary_size, eos_token=list(self.stop_token_ids)
                    )
                except Exception as error:  # a tokenizer llguidance cannot read: the request's fault is none
                    raise ValueError(f"The grammar engine cannot read this bundle's tokenizer.json: {error}") from error
            return self._tokenizer

    def compile(self, kind, spec):
        """A grammar of `kind` ("json": a JSON schema (a dict, or True for any JSON object), "regex", "choice":
        a list of strings, "grammar": Lark or GBNF text, "lark": llguidance's Lark as it is) -> llguidance's
        grammar, checked; a ValueError says what is wrong with it."""
        if kind not in KINDS:
            raise ValueError(f"The constraint's kind must be one of {KINDS}. Received: {kind!r}")
        tokenizer = self.tokenizer
        if kind == "json":
            schema = {"type": "object"} if spec is True else spec
            if not isinstance(schema, dict):
                raise ValueError(f"A JSON schema must be an object. Received: {str(spec)[:80]!r}")
            grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=JSON_OPTIONS)
        elif kind == "regex":
            if not isinstance(spec, str) or not spec:
                raise ValueError(f"A regex must be a non-empty string. Received: {spec!r:.80}")
            grammar = llguidance.LLMatcher.grammar_from_regex(spec)
        elif kind == "choice":
            if not isinstance(spec, list) or not spec or not all(isinstance(c, str) and c for c in spec):
                raise ValueError(f"The choices must be a non-empty list of non-empty strings. Received: {spec!r:.80}")
            grammar = llguidance.grammar_from("choice", spec)
        else:
            if not isinstance(spec, str) or not spec.strip():
                raise ValueError(f"A grammar must be Lark or GBNF text. Received: {spec!r:.80}")
            grammar = llguidance.grammar_from("grammar" if kind == "grammar" else "lark", spec)
        error = llguidance.LLMatcher.validate_grammar(grammar, tokenizer)
        if error:
            raise ValueError(error.strip())
        return grammar

    def matcher(self, grammar):
        """A fresh matcher of a compiled grammar: one per sequence."""
        matcher = llguidance.LLMatcher(self.tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise ValueError(matcher.get_error())
        return matcher


def allowed_tokens(matchers, vocabulary_size):
    """Each matcher's allowed tokens now -> (N, V) bool (a failed matcher's row may allow none: the caller
    allows its stop tokens)."""
    words = llguidance_numpy.allocate_token_bitmask(len(matchers), vocabulary_size)  # (N, W) int32
    for row, matcher in enumerate(matchers):
        llguidance_numpy.fill_next_token_bitmask(matcher, words, row)
    bits = np.unpackbits(words.view(np.uint8), axis=1, bitorder="little")  # (N, 32 W), bit i of word w: token 32w+i
    return bits[:, :vocabulary_size].astype(bool)
