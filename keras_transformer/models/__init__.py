"""Model families: backbones, task models and their preprocessors."""

from keras_transformer.models.backbone import Backbone
from keras_transformer.models.causal_lm import CausalLM
from keras_transformer.models.gpt import GPTBackbone, GPTCausalLM, GPTCausalLMPreprocessor
from keras_transformer.models.preprocessor import Preprocessor
from keras_transformer.models.task import Task
