"""GreedySampler: the most likely token at every step."""

import keras

from keras_transformer.kernels.loop_ops import first_argmax
from keras_transformer.samplers.sampler import Sampler


@keras.saving.register_keras_serializable(package="keras_transformer")
class GreedySampler(Sampler):
    """Picks the argmax of the logits at every step (deterministic).

    Example:
    >>> from keras_transformer.models import GPTCausalLM
    >>> lm = GPTCausalLM.from_preset("gpt_stdlib")
    >>> lm.generate("for i in range(", max_new_tokens=8, sampler=GreedySampler())
    'for i in range(x)\\n\\n\\ndef _convert'
    """

    def get_next_token(self, logits, uniform):
        return first_argmax(logits)  # (R, V) -> (R,)
