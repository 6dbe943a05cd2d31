"""The PyTorch evaluation step as one compiled graph (see `compiled_step.py`)."""

import keras

from keras_transformer.models.compiled_step import CompiledStep, write


class CompiledTestStep(CompiledStep):
    """`model.test_function` on PyTorch (`evaluate`, and validation in `fit`): forward, loss and metric
    updates as one compiled graph per input signature, as Keras's `test_step`.

    Returns:
        The logs dict (metric name -> scalar tensor), as `test_step` returns.
    """

    kind = "evaluation step"

    def _state(self):
        model = self.model
        return self._variables([model.trainable_variables, model.non_trainable_variables, model.metrics_variables]), 0

    def _eager_step(self, batch):
        import torch

        with torch.no_grad():
            return self.model.test_step(batch)

    def _step(self, values, x, y, sample_weight):
        model = self.model
        variables, _ = self._vars
        with keras.StatelessScope(state_mapping=list(zip(variables, values)), collect_losses=True) as scope:
            y_pred = model(x, training=False)
            loss = model._compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=False)
            batch_size = next(i for i in keras.tree.flatten(x) if i is not None).shape[0]
            model._loss_tracker.update_state(loss, sample_weight=batch_size)
            logs = model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)
            new_values = [scope.get_current_value(v) for v in variables]
        write(values, new_values)
        return logs
