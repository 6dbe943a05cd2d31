"""`CausalLM.generate_constrained(..., json_schema=, regex=, grammar=)`: constrained decoding, host-stepped.

`generate(..., json_schema=...)` routes here (`CausalLM._generate_constrained`).

The grammar engine is llguidance, as in the bundle server (export/runtime/constraint.py): it masks each
step's logits so that only tokens keeping the text inside the grammar can be chosen, and it allows the end
tokens exactly when the grammar accepts the text so far. The mask is computed on the host from the matcher's
state, so this loop is not the compiled one: it runs the model's cached step (`call_with_cache`) one token
at a time, eagerly, one prompt after another. Its cost against the compiled loop is in benchmarks/RESULTS.md,
"Constrained decoding".

Axes: T prompt length, S cache length (prompt + max_new_tokens), V vocabulary.
"""

import json

import numpy as np
from keras import ops

from keras_transformer.decoding.decode_loop import refresh_after
from keras_transformer.decoding.generate_inputs import stop_token_ids as read_stop_token_ids
from keras_transformer.samplers.random_sampler import RandomSampler

try:
    import llguidance
    import llguidance.numpy as llguidance_numpy
except ModuleNotFoundError:  # an optional dependency: only constrained generation needs it
    llguidance = llguidance_numpy = None

# JSON as the model writes it: no whitespace between tokens (as the bundle server).
JSON_OPTIONS = {"whitespace_flexible": False}


def constrained_generate(task, inputs, max_new_tokens, sampler, stop_token_ids, constraints):
    """`generate` under one constraint of `constraints` ({"json_schema": a dict, "regex": str, "grammar": Lark
    or GBNF text}: exactly one not None). Strings in, strings out (prompt + continuation); id lists in, id
    lists out. Greedy, or a `RandomSampler` with its temperature and seed (no top-k/top-p)."""
    given = {name: value for name, value in constraints.items() if value is not None}
    if len(given) != 1:
        raise ValueError(f"Give one of `json_schema`, `regex` or `grammar`. Received: {sorted(given)}")
    if llguidance is None:
        raise ValueError("Constrained generation needs the llguidance package: pip install llguidance")
    if task.preprocessor is None:
        raise ValueError("Constrained generation needs a task with a preprocessor (the grammar reads its tokenizer).")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"`max_new_tokens` must be a positive int. Received: max_new_tokens={max_new_tokens!r}")
    temperature, seed = _sampling(sampler)
    tokenizer, vocabulary_size = task.preprocessor.tokenizer, task.backbone.vocabulary_size
    stops = read_stop_token_ids(stop_token_ids, tokenizer, vocabulary_size)
    if not stops:
        raise ValueError("Constrained generation needs stop tokens (the grammar's end). Received: stop_token_ids=None")
    ll_tokenizer = llguidance.LLTokenizer(
        tokenizer.backend_tokenizer.to_str(), n_vocab=vocabulary_size, eos_token=list(stops)
    )
    grammar = _compile(given, ll_tokenizer)
    single = isinstance(inputs, str) or (isinstance(inputs, list) and inputs and isinstance(inputs[0], int))
    rows = [inputs] if single else list(inputs)
    if all(isinstance(row, str) for row in rows):
        prompts = task.preprocessor.generate_preprocess(rows)
    elif all(isinstance(row, list) and row and all(isinstance(t, int) for t in row) for row in rows):
        prompts = rows
    else:
        raise ValueError("Constrained generation takes a string, a list of strings, or token id lists.")
    rng = np.random.default_rng(seed)
    results = []
    for prompt in prompts:
        matcher = llguidance.LLMatcher(ll_tokenizer, grammar, log_level=0)
        results.append(list(prompt) + _decode(task, list(prompt), matcher, max_new_tokens, stops, temperature, rng))
    if isinstance(rows[0], str):
        results = [tokenizer.detokenize(row) for row in results]
    return results[0] if single else results


def _sampling(sampler):
    """-> (temperature, seed): 0 for greedy."""
    if sampler is None or sampler == "greedy":
        return 0.0, None
    if isinstance(sampler, RandomSampler) and sampler.top_k is None and sampler.top_p is None:
        return sampler.temperature, sampler.seed
    raise ValueError(
        "Constrained generation samples greedily or with a RandomSampler(temperature, seed) (no top-k/top-p). "
        f"Received: sampler={sampler!r}"
    )


def _compile(given, ll_tokenizer):
    ((name, value),) = given.items()
    if name == "json_schema":
        if not isinstance(value, dict):
            raise ValueError(f"`json_schema` must be a dict. Received: json_schema={value!r:.80}")
        grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(value), defaults=JSON_OPTIONS)
    elif not isinstance(value, str) or not value:
        raise ValueError(f"`{name}` must be a non-empty string. Received: {name}={value!r:.80}")
    elif name == "regex":
        grammar = llguidance.LLMatcher.grammar_from_regex(value)
    else:
        grammar = llguidance.grammar_from("grammar", value)
    error = llguidance.LLMatcher.validate_grammar(grammar, ll_tokenizer)
    if error:
        raise ValueError(f"`{name}` is not a grammar the engine can follow: {error.strip()} Received: {value!r:.120}")
    return grammar


def _decode(task, prompt, matcher, max_new_tokens, stops, temperature, rng):
    """One prompt's new tokens: prefill, then a masked choice and a cached step per token."""
    length = len(prompt) + max_new_tokens  # S
    if length > task.backbone.max_sequence_length:
        raise ValueError(
            f"The prompt ({len(prompt)} tokens) plus max_new_tokens={max_new_tokens} is longer than the model's "
            f"max_sequence_length={task.backbone.max_sequence_length}."
        )
    _, layers, _, heads, _, head_dim = task.backbone.cache_shape(1, length)
    dtype = task.backbone.compute_dtype
    cache = [tuple(ops.zeros((1, heads, length, head_dim), dtype) for _ in range(2)) for _ in range(layers)]
    logits, cache = task.call_with_cache(ops.convert_to_tensor([prompt], "int32"), cache, 0)  # (1, T, V)
    mask = llguidance_numpy.allocate_token_bitmask(1, logits.shape[-1])  # (1, ceil(V / 32)) int32
    new = []
    refresh = refresh_after(task.backbone)  # see decoding/decode_loop.py's `_refresh_step`
    for step in range(max_new_tokens):
        scores = ops.convert_to_numpy(logits[0, -1]).astype(np.float64)  # (V,)
        llguidance_numpy.fill_next_token_bitmask(matcher, mask)
        allowed = np.unpackbits(mask.view(np.uint8), bitorder="little")[: scores.size].astype(bool)
        if not allowed.any():  # a failed matcher: end the sequence
            allowed[list(stops)] = True
        scores = np.where(allowed, scores, -np.inf)
        if temperature > 0:
            probabilities = np.exp((scores - scores.max()) / temperature)
            token = int(rng.choice(scores.size, p=probabilities / probabilities.sum()))
        else:
            token = int(np.argmax(scores))
        matcher.consume_token(token)
        new.append(token)
        if token in stops or step + 1 == max_new_tokens:
            break
        if refresh is not None and len(prompt) + len(new) == refresh + 1:  # the cache went stale (longrope)
            empty = [tuple(ops.zeros_like(part) for part in layer) for layer in cache]
            logits, cache = task.call_with_cache(ops.convert_to_tensor([prompt + new], "int32"), empty, 0)
            continue
        logits, cache = task.call_with_cache(ops.convert_to_tensor([[token]], "int32"), cache, len(prompt) + step)
    return new
