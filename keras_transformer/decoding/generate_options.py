"""GenerateOptions: `generate`'s keyword arguments as one frozen, checked object."""

import dataclasses
import numbers
from typing import Any


@dataclasses.dataclass(frozen=True)
class GenerateOptions:
    """`generate`'s options (see `LanguageModel.generate` for what each means), checked when built.

    `LanguageModel.generate` builds one and hands it down to `decoding.generate_with`; what depends on the
    sampler (a streamer or logits with beam search) is checked there, once the sampler is known.
    """

    max_new_tokens: int = 32
    sampler: Any = None  # None (the task's own, else greedy), a name, a config or a `Sampler`
    stop_token_ids: Any = "auto"
    min_new_tokens: int = 0
    repetition_penalty: Any = None  # None: the task's generation config's, else 1.0
    no_repeat_ngram_size: int = 0
    streamer: Any = None
    return_dict: bool = False
    output_logits: bool = False
    prompt_lookup_num_tokens: Any = None  # None, or K >= 1: speculative decoding by prompt lookup
    max_matching_ngram_size: Any = None  # None (2), or N >= 1: prompt lookup's longest n-gram
    draft_model: Any = None  # None, or a language model with the same vocabulary: speculative decoding
    num_draft_tokens: Any = None  # None (5 with a draft model), or K >= 1

    def __post_init__(self):
        _check_int("max_new_tokens", self.max_new_tokens, 1)
        _check_int("min_new_tokens", self.min_new_tokens, 0)
        _check_int("no_repeat_ngram_size", self.no_repeat_ngram_size, 0)
        penalty = self.repetition_penalty
        if penalty is not None and (
            isinstance(penalty, bool) or not isinstance(penalty, numbers.Real) or not penalty > 0
        ):
            raise ValueError(f"`repetition_penalty` must be a number > 0. Received: repetition_penalty={penalty!r}")
        for name in ("prompt_lookup_num_tokens", "max_matching_ngram_size", "num_draft_tokens"):
            if getattr(self, name) is not None:
                _check_int(name, getattr(self, name), 1)
        if self.prompt_lookup_num_tokens is not None and self.draft_model is not None:
            raise ValueError(
                "Speculative decoding takes one proposer: `prompt_lookup_num_tokens` or `draft_model`, not both. "
                f"Received: prompt_lookup_num_tokens={self.prompt_lookup_num_tokens}, draft_model={self.draft_model!r}"
            )
        if self.num_draft_tokens is not None and self.draft_model is None:
            raise ValueError(
                f"`num_draft_tokens` needs a `draft_model`. Received: num_draft_tokens={self.num_draft_tokens}, "
                "draft_model=None"
            )
        if self.max_matching_ngram_size is not None and self.prompt_lookup_num_tokens is None:
            raise ValueError(
                f"`max_matching_ngram_size` needs `prompt_lookup_num_tokens`. Received: max_matching_ngram_size="
                f"{self.max_matching_ngram_size}, prompt_lookup_num_tokens=None"
            )
        if self.streamer is not None and not callable(self.streamer):
            raise ValueError(f"`streamer` must be a callable or None. Received: streamer={self.streamer!r}")


def _check_int(name, value, minimum):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"`{name}` must be an int >= {minimum}. Received: {name}={value!r}")
