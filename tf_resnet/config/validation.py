"""Whether a run's settings make sense together, checked before it starts.

Each group is checked against its own declarations (`schema.check`: finite
numbers, choices, bounds); then what ties fields of several groups
together, the engine's own constraints, and whether the model's family
takes the options given (`families`), all before any file is read
or TensorFlow starts, each with one message.
"""

import os

from tf_resnet.config import engines, families, schema
from tf_resnet.config.settings import GROUPS
from tf_resnet.engines import registry
from tf_resnet.errors import UserInputError


def validate(config):
    """Rejects contradictory or out-of-range settings with one message.

    Each group against its schema (finite numbers, choices, bounds), then
    what ties fields together, the engine's own constraints and the
    options the model's family takes.
    """
    for group in GROUPS:
        schema.check(getattr(config, group))
    data, run, optim = config.data, config.run, config.optim
    model, dist = config.model, config.distribution
    if run.eval_once and run.mode != "eval":
        raise UserInputError("--eval_once only makes sense with --mode=eval")
    for name in ("export_dir", "checkpoint", "litert"):
        if getattr(run, name) and run.mode != "export":
            raise UserInputError(
                f"--{name} only makes sense with --mode=export"
            )
    if run.mode == "export" and not run.export_dir:
        raise UserInputError("--mode=export needs --export_dir")
    if run.mode == "eval" and os.path.realpath(
        run.eval_dir
    ) == os.path.realpath(run.log_root):
        raise UserInputError(
            f"--eval_dir={run.eval_dir} is --log_root: the eval job writes "
            "its eval.csv and learning curve in --eval_dir, and would "
            "overwrite the training run's; give it a directory of its own"
        )
    engine = None
    if dist.distribution != registry.AUTO:
        engine = registry.get(dist.distribution)
        engines.check_settings(engine, dist)
    # Export reads the checkpoint and the saved plan, no data.
    if not dist.is_server_task and run.mode != "export":
        _check_data(data, run)
    if model.sync_bn and engine and engine.per_process:
        # Keras' synchronized BN all-reduces over tf.distribute replicas only;
        # under Horovod it would silently normalise each rank on its own.
        raise UserInputError(
            f"--sync_bn is not supported with --distribution="
            f"{dist.distribution}: it synchronises tf.distribute replicas "
            "only (BN moving statistics are still averaged over ranks)"
        )
    if model.sync_bn and optim.accumulate_steps > 1:
        # Its all-reduce would sit in the loop over the micro-batches,
        # which tf.distribute refuses (a merge_call in control flow).
        raise UserInputError(
            f"--sync_bn does not work with --accumulate_steps="
            f"{optim.accumulate_steps}: synchronised BN would all-reduce "
            "inside the loop over the micro-batches; drop one of them"
        )
    # A model registered at run time (the tests') has no family here; its
    # builder checks its options.
    variant = families.VARIANTS.get(model.model)
    if variant is not None:
        variant.family.resolve(model.model, model.given())
    if optim.freeze_backbone_epochs and not model.pretrained:
        who = (
            f"--preset={config.preset}"
            if config.preset
            else f"--freeze_backbone_epochs={optim.freeze_backbone_epochs}"
        )
        raise UserInputError(
            f"{who} fine-tunes ImageNet weights: pass --pretrained=PATH "
            "(e.g. torchvision's resnet18-f37072fd.pth)"
        )


def _check_data(data, run):
    if data.data_source == "tfds":
        if data.train_data_path or data.eval_data_path:
            raise UserInputError(
                "--data_source=tfds reads --tfds_data_dir; drop "
                "--train_data_path/--eval_data_path"
            )
    elif run.mode == "train" and not data.train_data_path:
        raise UserInputError("--mode=train needs --train_data_path")
    elif not data.eval_data_path:
        raise UserInputError(
            "--eval_data_path is required (evaluation runs in both modes)"
        )
