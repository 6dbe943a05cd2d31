"""Which request fields each endpoint implements: any other field gets a 400 that names it, as OpenAI's API
answers an argument it does not know ("Unrecognized request argument supplied"), rather than being ignored.

A documented OpenAI field the server does not implement is still accepted when it holds its neutral value
(null, or the value that changes nothing, e.g. `frequency_penalty: 0`): some clients send those always.
"""

from serve_validation import ApiError

# Implemented by both generation endpoints (OpenAI's, then this server's and vLLM's extensions).
_SHARED = {
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "seed",
    "stop",
    "n",
    "stream",
    "stream_options",
    "logprobs",
    "response_format",
    "structured_outputs",
    "user",  # an end-user id for the provider's abuse monitoring: no effect on the answer
    "top_k",
    "num_beams",
    "length_penalty",
    "timeout",
    "prompt_lookup_num_tokens",  # transformers' and vLLM's speculative decoding by prompt lookup (greedy)
    "num_draft_tokens",  # speculative decoding with the server's --draft bundle (transformers' num_assistant_tokens)
}
IMPLEMENTED = {
    "completions": _SHARED | {"prompt", "echo"},
    "chat_completions": _SHARED
    | {
        "messages",
        "max_completion_tokens",
        "top_logprobs",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "chat_template_kwargs",
    },
    "embeddings": {"model", "input", "encoding_format", "user"},
}

# Documented OpenAI fields this server does not implement, with the values that ask for nothing.
_NEUTRAL = {
    "frequency_penalty": (0,),
    "presence_penalty": (0,),
    "logit_bias": ({},),
    "best_of": (1,),
    "suffix": ("",),
    "store": (False,),
    "metadata": ({},),
    "service_tier": ("auto", "default"),
    "modalities": (["text"],),
    "dimensions": (),
    "function_call": ("none", "auto"),
    "functions": ([],),
}


def check_fields(body, endpoint):
    """A 400 naming the first field of `body` that `endpoint` does not implement (unless it holds a neutral
    value, see `_NEUTRAL`)."""
    for name, value in body.items():
        if name in IMPLEMENTED[endpoint] or value is None or value in _NEUTRAL.get(name, ()):
            continue
        raise ApiError(
            f"{name!r} is not supported by this server (it implements {', '.join(sorted(IMPLEMENTED[endpoint]))}). "
            f"Received: {name}={value!r:.80}",
            name,
        )
