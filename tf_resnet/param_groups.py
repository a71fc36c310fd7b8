"""Backbone and classifier as two parameter groups of the training loop.

Fine-tuning trains the two parts differently: `--freeze_backbone_epochs`
freezes the backbone, `--backbone_lr_multiplier` and `--head_lr_multiplier`
set their learning rates apart. That is a decision of the training loop,
not a property of a model, so it lives here; the models only promise that
the classifier is the layer named `models.HEAD_LAYER`.
"""

from tf_resnet.models import HEAD_LAYER


def is_backbone_variable(variable):
    """Everything but the classifier belongs to the backbone."""
    return not variable.path.startswith(f"{HEAD_LAYER}/")


def set_backbone_trainable(model, trainable):
    """Freezes or unfreezes every layer but the classifier.

    A frozen Keras `BatchNormalization` runs in inference mode (moving
    statistics, no updates), as fine-tuning needs. Takes effect in a train
    step traced after the call.
    """
    for layer in model.layers:
        if layer.name != HEAD_LAYER:
            layer.trainable = trainable


def scale_gradients(grads, variables, backbone=1.0, head=1.0):
    """Multiplies the backbone's and the classifier's gradients.

    For SGD with momentum, scaling a variable's gradient (which includes
    its L2 term) by m is the same as scaling its learning rate by m: a
    slower backbone when fine-tuning, or a slower classifier where its
    inputs are large (docs/recipes.md, `course_resnet`).
    """
    if backbone == 1.0 and head == 1.0:
        return grads
    scaled = []
    for grad, variable in zip(grads, variables, strict=True):
        factor = backbone if is_backbone_variable(variable) else head
        # No multiply op for the unscaled part: one per variable per step.
        scaled.append(grad if grad is None or factor == 1.0 else grad * factor)
    return scaled
