"""`generate`'s signature is written once, by `LanguageModel`: no task overrides it, and the decoding function
it calls (`decoding.generate`, a floor below the models) takes the same arguments with the same defaults, but for
the chat template's variables, which the task reads before decoding."""

import inspect

import keras_transformer  # noqa: F401  (loads every family, so that every task class exists)
from keras_transformer import decoding
from keras_transformer.models.language_model import LanguageModel


def _subclasses(cls):
    return {cls} | {sub for direct in cls.__subclasses__() for sub in _subclasses(direct)}


def test_no_task_writes_its_own_generate():
    tasks = {cls.__name__ for cls in _subclasses(LanguageModel)}
    assert {"CausalLM", "Seq2SeqLM", "GPTCausalLM", "LlamaCausalLM", "T5Seq2SeqLM", "TransformerSeq2SeqLM"} <= tasks
    assert sorted(cls.__name__ for cls in _subclasses(LanguageModel) - {LanguageModel} if "generate" in vars(cls)) == []


def test_the_decoding_function_takes_the_same_arguments():
    def arguments(function, skip):
        return [(p.name, p.default, p.kind) for p in list(inspect.signature(function).parameters.values())[skip:]]

    # LanguageModel.generate(self, inputs, ..., json_schema, regex, grammar, chat_template_kwargs) and
    # decoding.generate(task, inputs, ...): the constraints and the chat template's variables are read above the
    # floor (a causal LM renders chat messages to ids before decoding, and runs a constraint's host-stepped loop)
    model_arguments = arguments(LanguageModel.generate, 1)
    above = ("json_schema", "regex", "grammar", "chat_template_kwargs")
    assert model_arguments[-4:] == [(name, None, inspect.Parameter.POSITIONAL_OR_KEYWORD) for name in above]
    assert model_arguments[:-4] == arguments(decoding.generate, 1)
    assert len(arguments(decoding.generate, 1)) == 14  # inputs and the thirteen options
