"""keras_transformer: a Keras 3 Transformer model zoo for TensorFlow, JAX and PyTorch."""

from keras_transformer.backend_check import check_backend_installed

check_backend_installed()

from keras_transformer import layers, metrics, models, tokenizers  # noqa: E402
from keras_transformer.presets import list_presets  # noqa: E402
from keras_transformer import samplers  # noqa: E402
from keras_transformer import distribution  # noqa: E402

__version__ = "0.1.0"

__all__ = ["layers", "list_presets", "metrics", "models", "samplers", "tokenizers", "__version__"]
