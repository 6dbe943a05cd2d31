"""ExpertLoad: the experts' load of a mixture-of-experts model in `fit`'s logs, so that a collapse shows."""

import keras
import numpy as np

from keras_transformer.layers.router_losses import RouterLosses


class ExpertLoad(keras.callbacks.Callback):
    """Writes `expert_load_min` and `expert_load_max` into `fit`'s logs (the progress bar and `History`).

    In training, a mixture-of-experts backbone records, per MoE layer and expert, the share of the batch's
    token assignments that went to the expert (`RouterLosses.expert_load`, padding left out). This callback
    averages it over the epoch's batches so far and writes its smallest and largest entry over every layer and
    expert: both are 1 / E when the routing is balanced; a min near 0 is an expert no token uses, a max near
    1 / k (a token's k experts are distinct) a router that sends every token to the same expert.

    It is a callback, not a metric: Keras reads the metrics of the task, not of the backbone (a model of its
    own), and a layer's statistics reach the task only as state. The read costs one small device-to-host copy
    per batch on every backend.

    Attributes:
        epoch_loads: a list, per finished epoch, of the (M, E) numpy array of mean loads.
        load: the (M, E) mean load of the epoch under way (or the last one), or None before the first batch.

    Example:
    >>> import numpy as np
    >>> from keras_transformer.models import LlamaBackbone, LlamaCausalLM
    >>> moe = dict(num_experts=4, top_k=2, intermediate_dim=8)
    >>> backbone = LlamaBackbone(vocabulary_size=16, num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=8,
    ...                          mixture_of_experts=moe, router_aux_loss_coef=0.01)
    >>> lm = LlamaCausalLM(backbone, None)
    >>> lm.compile(optimizer="adam")
    >>> ids = np.arange(32, dtype="int32").reshape(4, 8) % 16
    >>> x = {"token_ids": ids, "padding_mask": np.ones((4, 8), bool)}
    >>> history = lm.fit(x, ids, epochs=1, verbose=0, callbacks=[ExpertLoad()])
    >>> sorted(key for key in history.history if key.startswith("expert_load"))
    ['expert_load_max', 'expert_load_min']
    """

    def __init__(self):
        super().__init__()
        self.epoch_loads = []
        self.load = None
        self._sum, self._batches, self._variables, self._indices = None, 0, [], []

    def on_train_begin(self, logs=None):
        layers = [layer for layer in self.model._flatten_layers() if isinstance(layer, RouterLosses)]
        if not layers:
            raise ValueError(
                f"ExpertLoad needs a model with a mixture of experts; this {type(self.model).__name__} has none "
                "(no RouterLosses layer)."
            )
        self._variables = [layer.expert_load for layer in layers]
        positions = {id(v): i for i, v in enumerate(self.model.non_trainable_variables)}
        self._indices = [positions.get(id(v)) for v in self._variables]

    def on_epoch_begin(self, epoch, logs=None):
        self._sum, self._batches = None, 0

    def on_train_batch_end(self, batch, logs=None):
        loads = np.concatenate([self._current(v, i) for v, i in zip(self._variables, self._indices)], axis=0)  # (M, E)
        self._sum = loads if self._sum is None else self._sum + loads
        self._batches += 1
        self.load = self._sum / self._batches
        if logs is not None:
            logs.update(self._logs())

    def on_epoch_end(self, epoch, logs=None):
        if self.load is None:
            return
        self.epoch_loads.append(self.load)
        if logs is not None:
            logs.update(self._logs())

    def _logs(self):
        return {"expert_load_min": float(self.load.min()), "expert_load_max": float(self.load.max())}

    def _current(self, variable, index):
        """The variable's value after the last step: on JAX, `fit` holds the state outside the variables
        (`model._jax_state`, which Keras keeps for callbacks) until the epoch ends; `index` is the variable's
        position in `model.non_trainable_variables`."""
        state = getattr(self.model, "_jax_state", None)
        if state and state.get("non_trainable_variables") and index is not None:
            return np.asarray(state["non_trainable_variables"][index], dtype="float32")
        return np.asarray(keras.ops.convert_to_numpy(variable.value), dtype="float32")
