"""The PyTorch training step as one compiled graph (see `compiled_step.py`)."""

import keras

from keras_transformer.models.compiled_step import CompiledStep, write


class CompiledTrainStep(CompiledStep):
    """`model.train_function` on PyTorch: forward, loss, backward, optimizer update and metrics as one
    compiled graph per input signature.

    Args, call arguments and attributes: as `CompiledStep` (`eager_steps` counts Keras's `train_step`).

    Returns:
        The logs dict (metric name -> scalar tensor), as `train_step` returns.
    """

    kind = "training step"

    def _state(self):
        model = self.model
        if not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)
        trainable = list(model.trainable_variables)
        return self._variables(
            [trainable, model.non_trainable_variables, model.optimizer.variables, model.metrics_variables]
        ), len(trainable)

    def _eager_step(self, batch):
        return self.model.train_step(batch)

    def _step(self, values, x, y, sample_weight):
        import torch  # an optional dependency: this module is imported on every backend

        model = self.model
        variables, num_trainable = self._vars
        trainable = values[:num_trainable]
        # collect_losses: the layers' `add_loss` terms (a mixture of experts' router losses) reach `model.losses`,
        # which `_compute_loss` adds to the task's loss as Keras's own steps do.
        with keras.StatelessScope(state_mapping=list(zip(variables, values)), collect_losses=True) as scope:
            y_pred = model(x, training=True)
            loss = model._compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True)
            batch_size = next(i for i in keras.tree.flatten(x) if i is not None).shape[0]
            model._loss_tracker.update_state(loss, sample_weight=batch_size)
            scaled = model.optimizer.scale_loss(loss)
            grads = torch.autograd.grad(
                scaled, [scope.get_current_value(v) for v in variables[:num_trainable]], allow_unused=True
            )
            grads = [torch.zeros_like(t) if g is None else g for g, t in zip(grads, trainable)]
            with torch.no_grad():
                model.optimizer.apply(grads, variables[:num_trainable])
                logs = model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)
                new_values = [scope.get_current_value(v) for v in variables]
        write(values, new_values)
        return logs
