"""Reading Hugging Face config options: every option that changes the computation is either
mapped to ours or refused with a ValueError naming it (never silently ignored)."""

# Hugging Face activation names -> our FeedForward activations.
ACTIVATIONS = {
    "gelu": "gelu",  # exact (erf)
    "gelu_new": "gelu_approximate",  # tanh approximation (GPT-2)
    "gelu_pytorch_tanh": "gelu_approximate",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
}


def check_options(hf_config, required):
    """Each option in `required` must be absent (its default) or have the one value we implement."""
    model_type = hf_config.get("model_type")
    for key, supported in required.items():
        value = hf_config.get(key, supported)
        if value != supported:
            raise ValueError(
                f"Unsupported {model_type} config option {key}={value!r}: keras_transformer implements "
                f"only {key}={supported!r}."
            )


def activation(hf_config, key, default):
    """The activation named by option `key` as one of ours."""
    name = hf_config.get(key, default)
    if name not in ACTIVATIONS:
        raise ValueError(
            f"Unsupported {hf_config.get('model_type')} config option {key}={name!r}: supported "
            f"activations are {sorted(ACTIVATIONS)}."
        )
    return ACTIVATIONS[name]


def single_dropout(hf_config, defaults):
    """Our models have one dropout rate: the checkpoint's dropout options must agree."""
    values = {key: hf_config.get(key, default) for key, default in defaults.items()}
    values = {key: (0.0 if value is None else float(value)) for key, value in values.items()}
    if len(set(values.values())) > 1:
        listed = ", ".join(f"{key}={value}" for key, value in values.items())
        raise ValueError(
            f"Unsupported {hf_config.get('model_type')} config options {listed}: keras_transformer "
            "models use one dropout rate for embeddings, attention and sub-layer outputs."
        )
    return next(iter(values.values()))
