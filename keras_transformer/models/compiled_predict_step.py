"""The PyTorch prediction step as one compiled graph (see `compiled_step.py`)."""

import keras

from keras_transformer.models.compiled_step import CompiledStep


class CompiledPredictStep(CompiledStep):
    """`model.predict_function` on PyTorch: the forward pass (`training=False`) as one compiled graph
    per input signature, as Keras's `predict_step`.

    Returns:
        The model's outputs for the batch.
    """

    kind = "prediction step"

    def _state(self):
        return self._variables([self.model.trainable_variables, self.model.non_trainable_variables]), 0

    def _eager_step(self, batch):
        import torch

        with torch.no_grad():
            return self.model.predict_step(batch)

    def _step(self, values, x, y, sample_weight):
        with keras.StatelessScope(state_mapping=list(zip(self._vars[0], values))):
            return self.model(x, training=False)
