"""Reusable absl flag groups, in the manner of official/utils/flags.

The names and meanings of the original tensorflow/models `resnet_main.py`
and of the Ray ResNet example are kept: `--dataset --mode --train_data_path
--eval_data_path --log_root --train_dir --eval_dir --eval_batch_count
--eval_once --num_gpus --image_size`.
"""

from absl import flags

from tf_resnet import data, models
from tf_resnet.distribute import DISTRIBUTIONS
from tf_resnet.errors import UserInputError
from tf_resnet.train_loop import TrainConfig

FLAGS = flags.FLAGS


def define_data_flags():
    flags.DEFINE_enum("dataset", "cifar10", sorted(data.DATASETS), "Dataset.")
    flags.DEFINE_string(
        "data_source", "binary", "On-disk format: binary (official CIFAR binaries)."
    )
    flags.DEFINE_string(
        "train_data_path", "", "Glob of training files, e.g. "
        "cifar-10-batches-bin/data_batch*, cifar-100-binary/train.bin."
    )
    flags.DEFINE_string(
        "eval_data_path", "", "Glob of evaluation files, e.g. "
        "cifar-10-batches-bin/test_batch.bin."
    )
    flags.DEFINE_integer(
        "image_size", None, "Side of the model input; images are resized "
        "when it differs from the dataset's (e.g. 224 for ImageNet weights)."
    )
    flags.DEFINE_integer("shuffle_buffer", 10_000, "Training shuffle buffer.")


def define_run_flags():
    flags.DEFINE_enum("mode", "train", ["train", "eval"], "train or eval.")
    flags.DEFINE_string(
        "log_root", "/tmp/resnet_model", "Checkpoints, eval.csv and the "
        "learning curve go here; a run resumes from its latest checkpoint."
    )
    flags.DEFINE_string("train_dir", "", "TensorBoard train dir (default log_root/train).")
    flags.DEFINE_string("eval_dir", "", "TensorBoard eval dir (default log_root/eval).")
    flags.DEFINE_integer(
        "eval_batch_count", 0, "Evaluate only this many batches (0: all records)."
    )
    flags.DEFINE_bool("eval_once", False, "--mode=eval: evaluate the latest checkpoint once.")
    flags.DEFINE_float(
        "eval_timeout_secs", 3600, "--mode=eval: stop after this long without a new checkpoint."
    )
    flags.DEFINE_integer("eval_every_steps", 0, "Evaluate while training every N steps (0: each epoch).")
    flags.DEFINE_integer("checkpoint_every_steps", 0, "Checkpoint every N steps (0: at each evaluation).")
    flags.DEFINE_integer("keep_checkpoints", 5, "Checkpoints kept in log_root.")
    flags.DEFINE_integer("log_every_steps", 100, "Progress line and train summaries every N steps.")
    flags.DEFINE_integer("seed", 0, "Seed of weights, shuffling and augmentation.")


def define_training_flags():
    flags.DEFINE_enum("model", "resnet20", sorted(models.MODELS), "Architecture.")
    flags.DEFINE_enum(
        "shortcut", None, ["zero_pad", "projection"], "Shortcut on shape changes "
        "(default: the model's own: zero_pad for CIFAR ResNets)."
    )
    flags.DEFINE_bool("sync_bn", False, "Synchronise BatchNorm batch statistics across replicas.")
    flags.DEFINE_integer(
        "batch_size", 128, "GLOBAL batch size: split over all replicas of all workers."
    )
    flags.DEFINE_integer("eval_batch_size", 0, "Evaluation batch per process (0: --batch_size).")
    flags.DEFINE_integer("train_steps", 0, "Optimizer steps (0: use --train_epochs, else 64000).")
    flags.DEFINE_float("train_epochs", 0, "Epochs, when --train_steps is 0.")
    flags.DEFINE_float(
        "learning_rate", 0.1, "Learning rate at batch 128; scaled linearly with the batch of one update."
    )
    flags.DEFINE_list(
        "lr_decay_fractions", ["0.5", "0.75"], "Fractions of the run at which the rate drops "
        "(the paper: 32k and 48k of 64k steps)."
    )
    flags.DEFINE_float("lr_decay_rate", 0.1, "Factor applied at each decay.")
    flags.DEFINE_float("warmup_epochs", 0, "Linear learning-rate warm-up.")
    flags.DEFINE_float("momentum", 0.9, "SGD momentum.")
    flags.DEFINE_float("weight_decay", 1e-4, "L2 weight decay on kernels.")


def define_distribution_flags():
    flags.DEFINE_enum(
        "distribution", "auto", list(DISTRIBUTIONS), "How replicas combine: auto "
        "(mirrored when several devices, else default)."
    )
    flags.DEFINE_integer("num_gpus", 0, "GPUs of this machine to use (MirroredStrategy when >1).")
    flags.DEFINE_integer(
        "cpu_replicas", 1, "Split the CPU into N logical devices (to exercise "
        "MirroredStrategy without GPUs)."
    )


def define_all():
    define_data_flags()
    define_run_flags()
    define_training_flags()
    define_distribution_flags()


def check_flags():
    """Rejects contradictory flags with one clear message."""
    if FLAGS.eval_once and FLAGS.mode != "eval":
        raise UserInputError("--eval_once only makes sense with --mode=eval")
    if FLAGS.mode == "train" and not FLAGS.train_data_path:
        raise UserInputError("--mode=train needs --train_data_path")
    if not FLAGS.eval_data_path:
        raise UserInputError("--eval_data_path is required (evaluation runs in both modes)")
    if FLAGS.batch_size <= 0:
        raise UserInputError(f"--batch_size must be positive, got {FLAGS.batch_size}")


def config_from_flags():
    """A `TrainConfig` from the parsed flags."""
    check_flags()
    model_options = {}
    if FLAGS.shortcut:
        model_options["shortcut"] = FLAGS.shortcut
    if FLAGS.sync_bn:
        model_options["sync_bn"] = True
    return TrainConfig(
        dataset=FLAGS.dataset,
        train_data_path=FLAGS.train_data_path or FLAGS.eval_data_path,
        eval_data_path=FLAGS.eval_data_path,
        data_source=FLAGS.data_source,
        log_root=FLAGS.log_root,
        train_dir=FLAGS.train_dir,
        eval_dir=FLAGS.eval_dir,
        model=FLAGS.model,
        model_options=model_options,
        image_size=FLAGS.image_size,
        batch_size=FLAGS.batch_size,
        eval_batch_size=FLAGS.eval_batch_size,
        train_steps=FLAGS.train_steps,
        train_epochs=FLAGS.train_epochs,
        base_learning_rate=FLAGS.learning_rate,
        lr_decay_fractions=tuple(float(f) for f in FLAGS.lr_decay_fractions),
        lr_decay_rate=FLAGS.lr_decay_rate,
        warmup_epochs=FLAGS.warmup_epochs,
        momentum=FLAGS.momentum,
        weight_decay=FLAGS.weight_decay,
        seed=FLAGS.seed,
        log_every_steps=FLAGS.log_every_steps,
        eval_every_steps=FLAGS.eval_every_steps,
        eval_batch_count=FLAGS.eval_batch_count,
        eval_once=FLAGS.eval_once,
        eval_timeout_secs=FLAGS.eval_timeout_secs,
        checkpoint_every_steps=FLAGS.checkpoint_every_steps,
        keep_checkpoints=FLAGS.keep_checkpoints,
        shuffle_buffer=FLAGS.shuffle_buffer,
    )
