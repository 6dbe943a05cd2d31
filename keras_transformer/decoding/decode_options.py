"""DecodeOptions: the static settings of one compiled decoding loop, frozen and complete when built."""

import dataclasses


@dataclasses.dataclass(frozen=True)
class DecodeOptions:
    """Static settings of one compiled loop; the object itself is part of its compile key.

    What a caller asks for (`generate` fills these):
        stop_token_ids: tuple of ints, the tokens that end a row.
        pad_id: int, the token written after a row is done.
        repetition: bool, whether a repetition penalty is applied (the penalty itself is an input).
        no_repeat_ngram_size: int, 0 for none.
        return_logits: bool, keep every step's logits (R, L, V).
        streaming: bool, the loop runs one step per call so that a streamer sees every token.

    How the loop runs (`compile.plan` sets these for the backend and device; the SavedModel's `generate`
    signatures run the defaults but `flat_cache`, their loop's shapes dynamic):
        beam_cache: beams keep their cache slots and an ancestry table follows them (no copy of
            the cache per step).
        padded_step: each one-row step pads its token to two (see `kv_cache.PaddedQueryCache`).
        chunked_cache: the cache grows through every width of `cache_schedule.cache_widths`.
        flat_cache: the loop carries each cache buffer as (R * Hkv, S, Dh), the shape XLA gives
            the batched attention products (see `cache_schedule.loop_cache`).
        eager_rows: steps run op by op (PyTorch eager): a beam reorder copies only the written cache
            positions, in place.
        gather_columns: a column of the token buffer is read by a gather (PyTorch), not by a dynamic
            slice (XLA) (see `rows.column`).
    """

    stop_token_ids: tuple = ()
    pad_id: int = 0
    repetition: bool = False
    no_repeat_ngram_size: int = 0
    return_logits: bool = False
    streaming: bool = False
    beam_cache: bool = False
    padded_step: bool = False
    chunked_cache: bool = True
    flat_cache: bool = True
    eager_rows: bool = False
    gather_columns: bool = False

    def __post_init__(self):
        # Normalised once, so that equal settings make equal compile keys.
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        object.__setattr__(self, "pad_id", int(self.pad_id))
        object.__setattr__(self, "no_repeat_ngram_size", int(self.no_repeat_ngram_size))
        for name in (
            "repetition",
            "return_logits",
            "streaming",
            "beam_cache",
            "padded_step",
            "chunked_cache",
            "flat_cache",
            "eager_rows",
            "gather_columns",
        ):
            object.__setattr__(self, name, bool(getattr(self, name)))

    def replace(self, **changes):
        """A copy with `changes` (the options stay frozen)."""
        return dataclasses.replace(self, **changes)
