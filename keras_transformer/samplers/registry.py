"""Samplers by name: `get("greedy")`, `get(config)`, `serialize` / `deserialize`."""

import keras

from keras_transformer.samplers.beam_sampler import BeamSampler
from keras_transformer.samplers.greedy_sampler import GreedySampler
from keras_transformer.samplers.random_sampler import RandomSampler
from keras_transformer.samplers.sampler import Sampler

# String names accepted by `get`, `generate(sampler=...)` and `compile(sampler=...)`.
_NAMED = {
    "greedy": GreedySampler,
    "random": RandomSampler,
    "top_k": lambda: RandomSampler(top_k=50),
    "top_p": lambda: RandomSampler(top_p=0.9),
    "beam": BeamSampler,
}


def get(name_or_sampler):
    """A `Sampler` from a name ("greedy", "random", "top_k", "top_p", "beam"), a config dict or a sampler."""
    if isinstance(name_or_sampler, Sampler):
        return name_or_sampler
    if isinstance(name_or_sampler, str) and name_or_sampler in _NAMED:
        return _NAMED[name_or_sampler]()
    if isinstance(name_or_sampler, dict):
        sampler = keras.saving.deserialize_keras_object(name_or_sampler)
        if isinstance(sampler, Sampler):
            return sampler
    raise ValueError(f"`sampler` must be one of {sorted(_NAMED)} or a Sampler. Received: sampler={name_or_sampler!r}")


def serialize(sampler):
    return keras.saving.serialize_keras_object(sampler)


def deserialize(config):
    return get(config)
