"""BeamSampler: beam search with a store of finished hypotheses and a length penalty.

Axes: B inputs, K beams, C candidates per input, R = B * K rows, L token buffer, V vocabulary.
"""

import numbers
from typing import Any, NamedTuple

import keras
from keras import ops

from keras_transformer.samplers.processors import NEG, is_stop_token
from keras_transformer.samplers.rows import column, write_column
from keras_transformer.samplers.sampler import Sampler


class BeamState(NamedTuple):
    """Beam search's own part of the loop state: the running beams' scores and the best finished hypotheses."""

    beam_scores: Any  # (B, K) float32: log-probability of each running beam
    done: Any  # (B,) bool
    finished_tokens: Any  # (B, K, L) int32, best first
    finished_scores: Any  # (B, K) float32: length-normalised scores
    finished_valid: Any  # (B, K) bool
    finished_ends: Any  # (B, K) int32: the position after each hypothesis


@keras.saving.register_keras_serializable(package="keras_transformer")
class BeamSampler(Sampler):
    """Beam search as in Hugging Face `generate(num_beams=...)`.

    Each input keeps K running beams scored by the sum of their tokens' log-probabilities.
    At every step the best C = max(2, 1 + #stop tokens) * K continuations of all beams are
    ranked; those among the top K that end in a stop token (or reach `max_new_tokens`) go to
    the input's store of K finished hypotheses, scored `sum_logprob / length**length_penalty`
    (length = generated tokens, the stop token included); the best K others become the new
    beams, and the rows of the token buffer follow them; so do the key/value cache's rows on
    PyTorch, while the compiled loops (JAX, TensorFlow) leave the cache in place and reorder a
    small ancestry table that tells each beam which slot holds each of its positions. The best
    `num_return_sequences` hypotheses of the store come back.

    Args:
        num_beams: int >= 1, K. `num_beams=1` is greedy decoding.
        length_penalty: float, exponent of the length in the score; > 0 favours longer outputs.
        early_stopping: True (an input is done once it has K finished hypotheses), False (done
            when the best running beam, scored at its current length, cannot beat the worst
            finished one), or "never" (the same test with the longest possible length when
            length_penalty > 0, so the search is exact about when to stop).
        num_return_sequences: int in [1, num_beams], results per input.

    Example:
    >>> from keras_transformer.models import GPTCausalLM
    >>> lm = GPTCausalLM.from_preset("gpt_stdlib")
    >>> lm.generate("for i in range(", max_new_tokens=8, sampler=BeamSampler(num_beams=4, num_return_sequences=2))
    ['for i in range(self.0.0.0.', 'for i in range(self.0.0.0)']
    """

    reorders_rows = True

    def __init__(self, num_beams=4, length_penalty=1.0, early_stopping=False, num_return_sequences=1):
        if isinstance(num_beams, bool) or not isinstance(num_beams, numbers.Integral) or num_beams < 1:
            raise ValueError(f"`num_beams` must be an int >= 1. Received: num_beams={num_beams!r}")
        if isinstance(length_penalty, bool) or not isinstance(length_penalty, numbers.Real):
            raise ValueError(f"`length_penalty` must be a number. Received: length_penalty={length_penalty!r}")
        if early_stopping not in (True, False, "never"):
            raise ValueError(
                f"`early_stopping` must be True, False or 'never'. Received: early_stopping={early_stopping!r}"
            )
        if (
            isinstance(num_return_sequences, bool)
            or not isinstance(num_return_sequences, numbers.Integral)
            or not 1 <= num_return_sequences <= num_beams
        ):
            raise ValueError(
                "`num_return_sequences` must be an int in [1, num_beams]. "
                f"Received: num_return_sequences={num_return_sequences!r}, num_beams={num_beams}"
            )
        self.num_beams = int(num_beams)
        self.length_penalty = float(length_penalty)
        self.early_stopping = early_stopping
        self.num_return_sequences = int(num_return_sequences)

    def get_config(self):
        return {
            "num_beams": self.num_beams,
            "length_penalty": self.length_penalty,
            "early_stopping": self.early_stopping,
            "num_return_sequences": self.num_return_sequences,
        }

    # --- loop hooks ----------------------------------------------------------

    def _prepare_scores(self, logits):
        return ops.log_softmax(logits, axis=-1)  # beams add log-probabilities

    def _initial_state(self, ctx):
        B, K, L = ctx.batch_size, self.num_beams, ctx.length
        # Only beam 0 is alive at first: the K copies of a prompt must not yield K equal beams.
        beam_scores = ops.concatenate([ops.zeros((B, 1)), ops.full((B, K - 1), NEG)], axis=1)  # (B, K)
        return BeamState(
            beam_scores=beam_scores,
            done=ops.zeros((B,), "bool"),
            finished_tokens=ops.full((B, K, L), ctx.pad_id, "int32"),
            finished_scores=ops.full((B, K), 2 * NEG, "float32"),
            finished_valid=ops.zeros((B, K), "bool"),
            finished_ends=ops.zeros((B, K), "int32"),
        )

    def _step(self, i, scores, state, ctx):
        B, K, V = ctx.batch_size, self.num_beams, scores.shape[-1]
        rows, beams = state.rows, state.sampler
        lengths = ops.reshape(ctx.prompt_lengths, (B, K))[:, 0]  # (B,)
        generated = i + 1 - lengths  # (B,) new tokens including this one
        in_prompt = i < lengths
        active = ops.logical_and(ops.logical_not(in_prompt), ops.logical_not(beams.done))  # (B,)
        at_limit = generated >= ctx.max_new_tokens

        # Best C continuations of all beams of an input.
        total = ops.reshape(scores, (B, K, V)) + beams.beam_scores[:, :, None]
        num_candidates = min(max(2, 1 + len(ctx.stop_token_ids)) * K, K * V)
        top_scores, top_index = ops.top_k(ops.reshape(total, (B, K * V)), num_candidates)  # (B, C)
        top_beam, top_token = top_index // V, ops.cast(top_index % V, "int32")
        finishes = ops.logical_or(is_stop_token(top_token, ctx.stop_token_ids), at_limit[:, None])  # (B, C)

        # Finished hypotheses: candidates ranked in the top K that stop, while the input is open.
        full = ops.all(beams.finished_valid, axis=1)
        accepting = ops.logical_and(active, ops.logical_not(full)) if self.early_stopping is True else active
        rank = ops.arange(num_candidates, dtype="int32")[None, :]  # (1, C)
        new_valid = finishes & (rank < K) & accepting[:, None] & (top_scores > NEG / 2)
        # Steps that run op by op (PyTorch eager) leave the store as it is when no candidate finishes,
        # as most steps: a dozen ops fewer per step. A compiled loop cannot branch on a tensor.
        store = (beams.finished_tokens, beams.finished_scores, beams.finished_valid, beams.finished_ends)
        if not ctx.options.eager_rows or bool(ops.convert_to_numpy(ops.any(new_valid))):
            candidates = (top_scores, top_beam, top_token, new_valid)
            store = self._merge_finished(beams, rows.tokens, candidates, i, generated, ctx)
        finished_tokens, finished_scores, finished_valid, finished_ends = store

        # Running beams: the best K candidates that did not finish.
        running = ops.where(finishes, top_scores + NEG, top_scores)
        beam_scores, pick = ops.top_k(running, K)  # (B, K)
        next_beam = ops.take_along_axis(top_beam, pick, axis=1)
        next_token = ops.take_along_axis(top_token, pick, axis=1)

        done = self._is_done(beam_scores, finished_scores, finished_valid, generated, at_limit, ctx)
        done = ops.where(active, done, beams.done)

        # Reorder the rows after the chosen beams; inputs not active this step stay in place.
        keep_beam = ops.broadcast_to(ops.arange(K, dtype="int32")[None, :], (B, K))
        next_beam = ops.where(active[:, None], ops.cast(next_beam, "int32"), keep_beam)
        flat = ops.reshape(ops.arange(B, dtype="int32")[:, None] * K + next_beam, (B * K,))  # (R,)
        rows = ctx.reorder_rows(rows, flat, i)  # the model has written positions [0, i)
        prompt_token = ops.reshape(column(rows.tokens, i, ctx.options.gather_columns), (B, K))
        token = ops.where(in_prompt[:, None], prompt_token, ops.where(active[:, None], next_token, ctx.pad_id))
        rows = rows._replace(tokens=write_column(rows.tokens, i, ops.reshape(token, (B * K,))))
        return state._replace(
            rows=rows,
            sampler=BeamState(
                beam_scores=ops.where(active[:, None], beam_scores, beams.beam_scores),
                done=done,
                finished_tokens=finished_tokens,
                finished_scores=finished_scores,
                finished_valid=finished_valid,
                finished_ends=finished_ends,
            ),
        )

    def _merge_finished(self, beams, tokens, candidates, i, generated, ctx):
        """The store of finished hypotheses with this step's finishing candidates merged in, best K kept.

        tokens: (R, L) the rows' buffers; candidates: (scores (B, C), beam (B, C), token (B, C), new_valid (B, C)).
        Returns (finished_tokens (B, K, L), finished_scores (B, K), finished_valid (B, K), finished_ends (B, K)).
        """
        top_scores, top_beam, top_token, new_valid = candidates
        B, K, L = ctx.batch_size, self.num_beams, ctx.length
        num_candidates = top_scores.shape[1]
        length = ops.cast(ops.maximum(generated, 1), "float32")[:, None]  # (B, 1)
        new_scores = ops.where(new_valid, top_scores / length**self.length_penalty, 2 * NEG)
        beam_tokens = ops.reshape(tokens, (B, K, L))
        candidate_tokens = ops.take_along_axis(beam_tokens, top_beam[:, :, None], axis=1)  # (B, C, L)
        positions = ops.arange(L, dtype="int32")[None, None, :]
        candidate_tokens = ops.where(positions == i, top_token[:, :, None], candidate_tokens)
        merged_scores = ops.concatenate([beams.finished_scores, new_scores], axis=1)  # (B, K + C)
        finished_scores, keep = ops.top_k(merged_scores, K)  # (B, K), sorted best first
        merged_valid = ops.concatenate([beams.finished_valid, new_valid], axis=1)
        merged_tokens = ops.concatenate([beams.finished_tokens, candidate_tokens], axis=1)  # (B, K + C, L)
        merged_ends = ops.concatenate(
            [beams.finished_ends, ops.full((B, num_candidates), 1, "int32") * (i + 1)], axis=1
        )
        finished_valid = ops.take_along_axis(merged_valid, keep, axis=1)
        finished_tokens = ops.take_along_axis(merged_tokens, keep[:, :, None], axis=1)
        finished_ends = ops.take_along_axis(merged_ends, keep, axis=1)
        return finished_tokens, finished_scores, finished_valid, finished_ends

    def _is_done(self, beam_scores, finished_scores, finished_valid, generated, at_limit, ctx):
        """(B,) whether each input is done, by Hugging Face's early-stopping rules."""
        if self.early_stopping == "never" and self.length_penalty > 0:
            best_length = ops.cast(ctx.max_new_tokens, "float32")
        else:
            best_length = ops.cast(ops.maximum(generated, 1), "float32")
        best_possible = beam_scores[:, 0] / best_length**self.length_penalty
        all_valid = ops.all(finished_valid, axis=1)
        worst = ops.where(all_valid, ops.amin(finished_scores, axis=1), NEG)
        done = ops.logical_or(at_limit, best_possible <= worst)
        if self.early_stopping is True:
            done = ops.logical_or(done, all_valid)
        return done

    def _is_running(self, state):
        return ops.logical_not(ops.all(state.sampler.done))

    def _outputs(self, state):
        n, beams = self.num_return_sequences, state.sampler
        return {
            "token_ids": beams.finished_tokens[:, :n],  # (B, n, L)
            "ends": beams.finished_ends[:, :n],  # (B, n) position after each hypothesis
            "scores": beams.finished_scores[:, :n],  # (B, n) normalized scores
            "valid": beams.finished_valid[:, :n],
        }
