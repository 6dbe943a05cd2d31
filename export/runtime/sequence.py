"""Sequence: one sequence the scheduler (batching.py) decodes, and `choose`, its rows' next tokens.

Axes: N rows decoded together, V vocabulary.
"""

import collections
import os
import sys

# The runtime's other modules sit next to this file (a bundle's directory).
_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import numpy as np  # noqa: E402

from constraint import allowed_tokens  # noqa: E402
from sampling import NEG, Picker, noise, seed_to_int32, token_logprobs  # noqa: E402

__all__ = ["Sequence", "choose"]


class Sequence:
    """One sequence to generate: a prompt's ids and how to choose its tokens.

    Args:
        prompt_ids: list of ints (the start token included).
        max_tokens: int, the most new tokens.
        on_event: called from a decoding thread with ("token", id), then once with
            ("finish", reason): "stop" (a stop token), "length", "timeout", "cancelled", or
            ("error", message).
        temperature: 0 for greedy, else random sampling with `top_k`/`top_p`.
        seed: the random noise's seed (None: a fresh one); `choice` picks the noise's row, so
            choice c of seed s draws what row c of `Generator.generate(..., seed=s)` draws.
        stop_token_ids: ids that end the sequence (kept, as `Generator`).
        num_beams, length_penalty: beam search (run whole, beside the batch).
        logprobs: None, or report each token's log-probability with this many most likely alternatives
            (0 to 20): the token events are then ("token", (id, (logprob, top ids, top logprobs))).
        constraint: None, or the sequence's own grammar matcher (`constraint.Grammars.matcher`): its tokens
            are chosen among those the grammar allows, and it is told each one.
        prompt_lookup_num_tokens: None, or K: greedy decoding with prompt lookup (`prompt_lookup.py`), up to K drafts
            checked per pass; run whole, beside the batch. Its `drafted` and `accepted` counts are set when done.
        num_draft_tokens: None, or K: speculative decoding with the server's draft bundle (`prompt_lookup.py`'s
            `DraftProposer`), K drafts per pass, greedy or random (the rejection rule); run whole, as prompt lookup.
        deadline: `time.monotonic()` after which the sequence finishes with "timeout": at that time while
            it waits, at the next step while it holds a row or runs whole (beam search).
    """

    def __init__(
        self,
        prompt_ids,
        max_tokens,
        on_event,
        temperature=0.0,
        top_k=None,
        top_p=None,
        seed=None,
        choice=0,
        stop_token_ids=(),
        num_beams=1,
        length_penalty=1.0,
        deadline=None,
        logprobs=None,
        constraint=None,
        prompt_lookup_num_tokens=None,
        num_draft_tokens=None,
    ):
        self.prompt_ids, self.max_tokens, self.on_event = list(prompt_ids), int(max_tokens), on_event
        self.temperature, self.top_k, self.top_p = float(temperature), top_k, top_p
        if seed is None and self.temperature > 0:
            seed = int(np.random.randint(2**31))
        self.noise_seed = None if seed is None else seed_to_int32(seed)
        self.choice, self.stop_token_ids = int(choice), tuple(stop_token_ids)
        self.num_beams, self.length_penalty, self.deadline = int(num_beams), float(length_penalty), deadline
        self.logprobs, self.constraint = logprobs, constraint
        self.prompt_lookup_num_tokens, self.drafted, self.accepted = prompt_lookup_num_tokens, 0, 0
        self.num_draft_tokens = num_draft_tokens
        self.generated = []
        self.cached_tokens = 0  # prompt positions read from the prefix cache (set before the first token)
        self.cancelled = False  # set by any thread; the scheduler frees the row at the next step boundary
        self.queued = False  # in one of the scheduler's waiting queues (guarded by its lock)

    def cancel(self):
        self.cancelled = True

    @property
    def batched(self):
        """Decoded among others, a token per step (beam search and speculative decoding run whole)."""
        return self.num_beams == 1 and not self.speculative

    @property
    def speculative(self):
        """Decoded with drafts: prompt lookup's, or the server's draft bundle's."""
        return self.prompt_lookup_num_tokens is not None or self.num_draft_tokens is not None

    def same_request(self, other):
        """The same prompt and options (choices of one request): they can run as rows of one call."""
        return all(
            getattr(self, name) == getattr(other, name)
            for name in (
                "prompt_ids",
                "max_tokens",
                "temperature",
                "top_k",
                "top_p",
                "noise_seed",
                "stop_token_ids",
                "num_beams",
                "length_penalty",
                "logprobs",
                "prompt_lookup_num_tokens",
                "num_draft_tokens",
            )
        )

    def accept(self, token, logits=None):
        """Record and announce a token (chosen from `logits` (V,), the raw logits of its position) -> the finish
        reason, or None to go on."""
        self.generated.append(token)
        if self.constraint is not None:
            self.constraint.consume_token(token)
        if self.logprobs is None:
            self.on_event("token", token)
        else:  # one event: a reader never sees a token without its entry
            self.on_event("token", (token, token_logprobs(logits, token, self.logprobs)))
        if token in self.stop_token_ids:
            return "stop"
        return "length" if len(self.generated) >= self.max_tokens else None

    def interrupted(self, now):
        if self.cancelled:
            return "cancelled"
        return "timeout" if self.deadline is not None and now > self.deadline else None


def choose(sequences, logits, positions):
    """Each sequence's next token from its logits (N, V) at its position (N,) -> (N,) ids: greedy rows by one
    argmax, random rows grouped by their (temperature, top_k, top_p), each group drawn at once with each
    row's own noise. A constrained row chooses among the tokens its grammar allows."""
    masked = [row for row, sequence in enumerate(sequences) if sequence.constraint is not None]
    if masked:  # on a copy: the raw logits stay for the logprobs
        allowed = allowed_tokens([sequences[row].constraint for row in masked], logits.shape[-1])  # (C, V)
        for i, row in enumerate(masked):
            if not allowed[i].any():  # a failed matcher: end the sequence
                allowed[i, list(sequences[row].stop_token_ids)] = True
        logits = logits.copy()
        logits[masked] = np.where(allowed, logits[masked], NEG)
    chosen = np.argmax(logits, axis=-1)
    groups = collections.defaultdict(list)
    for row, sequence in enumerate(sequences):
        if sequence.temperature > 0:
            groups[sequence.temperature, sequence.top_k, sequence.top_p].append(row)
    for (temperature, top_k, top_p), rows in groups.items():
        drawn = [sequences[row] for row in rows]
        # Noise of (seed, position of the token, choice): what `Generator.generate(seed=s)` draws for row `choice`.
        uniform = noise([s.noise_seed for s in drawn], positions[rows], [s.choice for s in drawn])
        chosen[rows] = Picker("random", temperature, top_k, top_p)(logits[rows], uniform)
    return chosen
