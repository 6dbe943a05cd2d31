"""A task's config entries for `.keras` saving: its preprocessor (with the tokenizer) and its backbone, read
back only as classes this library registered."""

from keras_transformer.presets.registry import base_class, get_class, get_preprocessor_class
from keras_transformer.tokenizers import Tokenizer


def serialize_preprocessor(preprocessor):
    if preprocessor is None:
        return None
    return {
        "class_name": type(preprocessor).__name__,
        "config": preprocessor.get_config(),
        "tokenizer": preprocessor.tokenizer.to_config(),
    }


def deserialize_preprocessor(spec):
    if spec is None or not isinstance(spec, dict):
        return spec
    cls = get_preprocessor_class(spec["class_name"])  # only registered preprocessors
    return cls.from_config(spec["config"], tokenizer=Tokenizer.from_config(spec["tokenizer"]))


def deserialize_backbone(spec):
    Backbone = base_class("backbone")
    if isinstance(spec, Backbone):
        return spec
    cls = get_class(spec["class_name"], Backbone)
    config = spec["config"]
    return cls.from_config(config)
