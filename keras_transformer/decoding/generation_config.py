"""GenerationConfig: a model's own defaults for `generate`, as a checkpoint's generation_config.json gives them.

transformers reads a checkpoint's generation_config.json and uses it wherever the caller of `generate` says
nothing: several end tokens (Qwen3 and Llama 3 instruct models stop at either of two), and the sampling the
model was tuned for (Qwen3: temperature 0.6, top-k 20, top-p 0.95). A task keeps these as a
`GenerationConfig` (its `generation_config` attribute, saved with it); `generate` uses them for
`stop_token_ids="auto"`, `sampler=None` (after one set by `compile`) and `repetition_penalty=None`.
"""

import dataclasses
import numbers
from typing import Any

from keras_transformer import samplers


@dataclasses.dataclass(frozen=True)
class GenerationConfig:
    """Defaults of `generate`; None where the model has none.

    Args:
        stop_token_ids: a tuple of token ids where a row stops ("auto"'s ids); None: the tokenizer's end token.
        sampler: a sampler's config (`samplers.serialize`) or name; None: greedy.
        repetition_penalty: float > 0; None: 1.0 (no penalty).

    Example:
    >>> config = GenerationConfig(stop_token_ids=(2, 7), sampler="greedy")
    >>> GenerationConfig.from_config(config.get_config()) == config
    True
    """

    stop_token_ids: Any = None
    sampler: Any = None
    repetition_penalty: Any = None

    def __post_init__(self):
        ids = self.stop_token_ids
        if ids is not None:
            if not isinstance(ids, (list, tuple)) or not all(
                isinstance(i, numbers.Integral) and not isinstance(i, bool) and i >= 0 for i in ids
            ):
                raise ValueError(
                    "`stop_token_ids` of a generation config must be a list of token ids. "
                    f"Received: stop_token_ids={ids!r}"
                )
            object.__setattr__(self, "stop_token_ids", tuple(int(i) for i in ids))
        if self.sampler is not None:
            samplers.get(self.sampler)  # raises on a bad name or config
        penalty = self.repetition_penalty
        if penalty is not None and (isinstance(penalty, bool) or not isinstance(penalty, numbers.Real) or penalty <= 0):
            raise ValueError(
                "`repetition_penalty` of a generation config must be a number > 0. "
                f"Received: repetition_penalty={penalty!r}"
            )

    def get_config(self):
        """{field: value} of the fields set (JSON-ready)."""
        config = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        if config["stop_token_ids"] is not None:
            config["stop_token_ids"] = list(config["stop_token_ids"])
        return {name: value for name, value in config.items() if value is not None}

    @classmethod
    def from_config(cls, config):
        """A GenerationConfig from `get_config`'s dict, None, or a GenerationConfig (returned as it is).

        Raises:
            ValueError: a key that is not a field, or a bad value.
        """
        if config is None or isinstance(config, cls):
            return config
        names = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(config) - names)
        if unknown:
            raise ValueError(f"`generation_config` has no entries {unknown}; it takes {sorted(names)}.")
        return cls(**config)
