"""Sampler: the base of the token choosers (greedy, random, beam search).

Axes: R decoded rows, L token buffer length, V vocabulary.

A sampler only chooses tokens: `get_next_token` picks one per row from processed logits, and the
loop hooks below say how a choice updates the loop state. The hooks read the call's settings from `ctx`,
the engine's `StepContext` (keras_transformer/decoding/step_context.py), and know nothing else of the engine:
the loop (`decoding/decode_loop.py`), the cache schedule and the backend switch (`decoding/compile.py`)
import the samplers, never the reverse. This file has no backend check.
"""

from typing import Any, NamedTuple

import numpy as np
from keras import ops

from keras_transformer.samplers.noise import noise_grid, uniform_noise
from keras_transformer.samplers.processors import is_stop_token
from keras_transformer.samplers.rows import column, write_column


class TokenState(NamedTuple):
    """A one-token-per-row sampler's own part of the loop state (greedy, random)."""

    done: Any  # (R,) bool: the row stopped, or reached its limit
    emitted: Any  # (R,) int32: the token the row produced at the last step, -1 where none


class Sampler:
    """Base of the samplers: picks each row's next token from its (processed) logits.

    A sampler overrides `get_next_token`; beam search (`BeamSampler`) also overrides the
    loop hooks `_initial_state`, `_step`, `_is_running` and `_outputs`. Samplers are
    serialisable (`get_config` / `from_config`).
    """

    num_beams = 1
    num_return_sequences = 1
    reorders_rows = False  # True for beam search: rows follow their beams, results come from a store

    def get_next_token(self, logits, uniform):
        """Choose one token per row.

        Args:
            logits: (R, V) float32, after the logits processors.
            uniform: (R,) float32 noise in (0, 1], fresh at every step (see `draw_noise`), or
                None for a sampler that draws no seed (see `draw_seed`).

        Returns:
            (R,) int token ids.
        """
        raise NotImplementedError(f"{type(self).__name__} must define `get_next_token`.")

    def draw_seed(self):
        """The seed of one `generate` call's noise (an int32), or None: deterministic samplers draw none."""
        return None

    def draw_noise(self, shape):
        """The noise one `generate` call reads, (L, R) float32 in (0, 1]: entry [i, r] is
        `uniform_noise(seed, i, R)[r]` (see `noise.py`), computed in the loop; ones without a seed."""
        seed = self.draw_seed()
        if seed is None:
            return np.ones(shape, "float32")
        return ops.convert_to_numpy(noise_grid(seed, shape))

    def get_config(self):
        return {}

    @classmethod
    def from_config(cls, config):
        return cls(**config)

    def __repr__(self):
        arguments = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())
        return f"{type(self).__name__}({arguments})"

    # --- loop hooks (one token per row) ------------------------------------

    def _prepare_scores(self, logits):
        """Logits (R, V) -> the scores the processors and `_step` work on."""
        return logits

    def _initial_state(self, ctx):
        """The sampler's own part of the loop state (`LoopState.sampler`): a named tuple of tensors."""
        rows = ctx.num_rows
        return TokenState(done=ops.zeros((rows,), "bool"), emitted=ops.full((rows,), -1, "int32"))

    def _step(self, i, scores, state, ctx):
        """Write token i of every row; a row is done at a stop token or after max_new_tokens.

        state: the `LoopState`; returns it with the rows and the sampler's state updated.
        """
        rows, done = state.rows, state.sampler.done
        picked = ops.cast(self.get_next_token(scores, step_noise(ctx, i)), "int32")  # (R,)
        in_prompt = i < ctx.prompt_lengths  # (R,)
        emitted = ops.logical_and(ops.logical_not(in_prompt), ops.logical_not(done))
        prompt_token = column(rows.tokens, i, ctx.options.gather_columns)
        token = ops.where(in_prompt, prompt_token, ops.where(done, ctx.pad_id, picked))
        rows = rows._replace(tokens=write_column(rows.tokens, i, token))
        stopped = ops.logical_and(emitted, is_stop_token(token, ctx.stop_token_ids))
        done = ops.logical_or(ops.logical_or(done, stopped), i + 1 >= ctx.limits)
        return state._replace(rows=rows, sampler=TokenState(done=done, emitted=ops.where(emitted, token, -1)))

    def _is_running(self, state):
        return ops.logical_not(ops.all(state.sampler.done))

    def _outputs(self, state):
        return {"token_ids": state.rows.tokens}  # (R, L)

    def _trace_key(self):
        """What the compiled loop depends on: the config without the seed (an input of the loop)."""
        config = {k: v for k, v in self.get_config().items() if k != "seed"}
        return (type(self).__name__, tuple(sorted((k, repr(v)) for k, v in config.items())))


def step_noise(ctx, i):
    """The uniform noise of step i (R,) from the call's seed, or None when the sampler draws no seed."""
    if ctx.seed is None:
        return None
    return uniform_noise(ctx.seed, i, ctx.num_rows)
