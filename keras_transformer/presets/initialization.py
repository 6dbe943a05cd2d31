"""Building a model whose weights are about to be loaded, without drawing random initial values first.

Built the usual way, every variable of a preset's model first holds its initializer's random values, which the
loader then overwrites: a 0.5B model spends seconds drawing numbers nobody reads, and holds them beside each value
it loads. `build_then_load` builds the model inside a `keras.StatelessScope`, which leaves its variables
uninitialized, runs the loader inside a second one, which records what the loader assigns instead of applying
it, and gives each loaded variable its loaded value as its initializer. When the outer scope ends, Keras
initializes every variable: the loaded ones take their values (on JAX the recorded arrays themselves, on PyTorch a
contiguous copy of each, one at a time), the others (a new head) draw theirs as usual.

This is used where it pays (`defers_initialization`): on JAX and PyTorch, whose variables take a recorded tensor
with no second copy of the model. TensorFlow copies a tensor into a new variable, and a tensor converted from
numpy takes more memory than the array (RESULTS.md, "from_preset without random initial values"), so it keeps
the usual path; so do quantized layers (quantized after they are built, from float values) and a distribution
(variables laid out over devices as they are created).
"""

import keras


def defers_initialization(quantized):
    """Whether `build_then_load` builds the model about to be loaded; `quantized`: it has quantized layers."""
    return not quantized and keras.config.backend() in ("jax", "torch") and keras.distribution.distribution() is None


def build_then_load(build, load):
    """`build()` a model, then `load(model)` its weights into it, each loaded variable created from its value.

    A variable `load` does not assign (a head the preset has no weights for) gets its initializer's values.
    """
    with keras.StatelessScope():  # the variables created here are initialized when it ends
        model = build()
        with keras.StatelessScope() as loading:  # what `load` assigns is recorded here, not applied
            load(model)
        values = loading.state_mapping  # {id(variable): the value `load` assigned last}
        for variable in model.variables:
            if id(variable) in values:
                variable._initializer = _Take(values, id(variable))  # Keras offers no public hook for this
    return model


class _Take:
    """An initializer that hands over one recorded value, once (the record then holds it no longer)."""

    def __init__(self, values, key):
        self.values, self.key = values, key

    def __call__(self, shape, dtype=None):
        del shape, dtype  # the value's: `assign` checked its shape and cast it to the variable's dtype
        value = self.values.pop(self.key)
        if keras.config.backend() == "torch":
            # A PyTorch variable takes the tensor itself, and updates it in place. The loader's tensor may be a view
            # (a transposed kernel: a matmul over it rounds differently) or share memory with an array the loader
            # also gave another variable (tied weights): each variable gets its own contiguous copy, as `assign`
            # would have copied into the variable.
            import torch  # the backend's own

            value = torch.empty_like(value, memory_format=torch.contiguous_format).copy_(value)
        return value


__all__ = ["build_then_load", "defers_initialization"]
