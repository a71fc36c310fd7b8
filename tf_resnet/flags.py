"""Reusable absl flag groups, in the manner of official/utils/flags.

The names and meanings of the original tensorflow/models `resnet_main.py`
and of the Ray ResNet example are kept: `--dataset --mode --train_data_path
--eval_data_path --log_root --train_dir --eval_dir --eval_batch_count
--eval_once --num_gpus --image_size`.
"""

import os

import keras
import tensorflow as tf
from absl import flags

from tf_resnet import data, models
from tf_resnet.distribute import DISTRIBUTIONS
from tf_resnet.errors import UserInputError
from tf_resnet.train_loop import TrainConfig

FLAGS = flags.FLAGS


def define_data_flags():
    """Which dataset, where its files are and how it is read."""
    flags.DEFINE_enum("dataset", "cifar10", sorted(data.DATASETS), "Dataset.")
    flags.DEFINE_string(
        "data_source",
        "",
        "On-disk format; empty: inferred (folder for "
        "tinyimagenet; binary or pickle from the CIFAR files' first bytes). "
        "binary (official CIFAR binaries), pickle (official CIFAR python "
        "pickles: data_batch_*, test_batch; cifar-100-python/train, test), "
        "tfds (CIFAR prepared by tensorflow-datasets in --tfds_data_dir; "
        "never downloads, never inferred), folder (--dataset=tinyimagenet: "
        "tiny-imagenet-200 root as both data paths).",
    )
    flags.DEFINE_string(
        "tfds_data_dir",
        "",
        "--data_source=tfds: TFDS data dir of the "
        "prepared dataset (empty: ~/tensorflow_datasets), for both splits.",
    )
    flags.DEFINE_string(
        "train_data_path",
        "",
        "Glob of training files, e.g. "
        "cifar-10-batches-bin/data_batch*, cifar-100-binary/train.bin.",
    )
    flags.DEFINE_string(
        "eval_data_path",
        "",
        "Glob of evaluation files, e.g. cifar-10-batches-bin/test_batch.bin.",
    )
    flags.DEFINE_integer(
        "image_size",
        None,
        "Side of the model input; images are resized "
        "when it differs from the dataset's (e.g. 224 for ImageNet weights).",
    )
    flags.DEFINE_integer("shuffle_buffer", 10_000, "Training shuffle buffer.")


def define_run_flags():
    """Train or eval, where outputs go, how often to log/eval/checkpoint."""
    flags.DEFINE_enum("mode", "train", ["train", "eval"], "train or eval.")
    flags.DEFINE_string(
        "log_root",
        "/tmp/resnet_model",
        "Checkpoints, eval.csv and the "
        "learning curve go here; a run resumes from its latest checkpoint.",
    )
    flags.DEFINE_string(
        "train_dir", "", "TensorBoard train dir (default log_root/train)."
    )
    flags.DEFINE_string(
        "eval_dir", "", "TensorBoard eval dir (default log_root/eval)."
    )
    flags.DEFINE_integer(
        "eval_batch_count",
        0,
        "Evaluate only this many batches (0: all records).",
    )
    flags.DEFINE_bool(
        "eval_once", False, "--mode=eval: evaluate the latest checkpoint once."
    )
    flags.DEFINE_float(
        "eval_timeout_secs",
        3600,
        "--mode=eval: stop after this long without a new checkpoint.",
    )
    flags.DEFINE_integer(
        "eval_every_steps",
        0,
        "Evaluate while training every N steps (0: each epoch).",
    )
    flags.DEFINE_integer(
        "checkpoint_every_steps",
        0,
        "Checkpoint every N steps (0: at each evaluation).",
    )
    flags.DEFINE_integer("keep_checkpoints", 5, "Checkpoints kept in log_root.")
    flags.DEFINE_integer(
        "steps_per_run",
        0,
        "Stop (with a checkpoint) after this many steps in "
        "this invocation; rerun to continue. For time-sliced batch queues.",
    )
    flags.DEFINE_bool(
        "deterministic",
        False,
        "tf.config.experimental.enable_op_determinism(): "
        "bit-identical runs and resumes, somewhat slower.",
    )
    flags.DEFINE_integer(
        "log_every_steps",
        100,
        "Progress line and train summaries every N steps.",
    )
    flags.DEFINE_integer(
        "seed", 0, "Seed of weights, shuffling and augmentation."
    )


def define_training_flags():
    """Model, batch, schedule and optimizer (the paper's by default)."""
    flags.DEFINE_enum(
        "model", "resnet20", sorted(models.MODELS), "Architecture."
    )
    flags.DEFINE_enum(
        "shortcut",
        None,
        ["zero_pad", "projection"],
        "Shortcut on shape changes "
        "(default: the model's own: zero_pad for CIFAR ResNets).",
    )
    flags.DEFINE_bool(
        "sync_bn",
        False,
        "Synchronise BatchNorm batch statistics across replicas.",
    )
    flags.DEFINE_integer(
        "batch_size",
        128,
        "GLOBAL batch size: split over all replicas of all workers.",
    )
    flags.DEFINE_integer(
        "eval_batch_size", 0, "Evaluation batch per process (0: --batch_size)."
    )
    flags.DEFINE_integer(
        "train_steps", 0, "Optimizer steps (0: use --train_epochs, else 64000)."
    )
    flags.DEFINE_float("train_epochs", 0, "Epochs, when --train_steps is 0.")
    flags.DEFINE_float(
        "learning_rate",
        0.1,
        "Learning rate at batch 128; scaled linearly with the batch of one "
        "update.",
    )
    flags.DEFINE_list(
        "lr_decay_fractions",
        ["0.5", "0.75"],
        "Fractions of the run at which the rate drops "
        "(the paper: 32k and 48k of 64k steps).",
    )
    flags.DEFINE_float("lr_decay_rate", 0.1, "Factor applied at each decay.")
    flags.DEFINE_float("warmup_epochs", 0, "Linear learning-rate warm-up.")
    flags.DEFINE_float("momentum", 0.9, "SGD momentum.")
    flags.DEFINE_float("weight_decay", 1e-4, "L2 weight decay on kernels.")


def define_performance_flags():
    """Speed settings; bench/README.md has the measurements behind them."""
    flags.DEFINE_enum(
        "dtype",
        "auto",
        ["auto", "float32", "float64", "mixed_bfloat16", "mixed_float16"],
        "Keras dtype policy. auto: mixed_bfloat16 on a CPU-only machine "
        "whose CPU has AMX-BF16 (measured 1.5x faster training, same "
        "accuracy), else float32. mixed_float16 (GPU) adds loss scaling; "
        "float64 is for numerical verification.",
    )
    flags.DEFINE_bool(
        "xla",
        False,
        "Compile the forward and backward pass with XLA. Off "
        "by default: 4.8x slower on CPU (XLA's CPU convolutions bypass "
        "oneDNN); worth trying on GPUs.",
    )
    flags.DEFINE_integer(
        "intra_op_threads",
        0,
        "Threads one op may use (0: TensorFlow's default, one per core).",
        lower_bound=0,
    )
    flags.DEFINE_integer(
        "inter_op_threads",
        0,
        "Ops run concurrently (0: TensorFlow's default, one per core).",
        lower_bound=0,
    )


def cpu_has_amx_bf16(cpuinfo="/proc/cpuinfo"):
    """Whether the CPU advertises AMX-BF16 (Linux; False when unknown)."""
    try:
        with open(cpuinfo, encoding="utf-8") as stream:
            return any(
                line.startswith("flags") and "amx_bf16" in line.split()
                for line in stream
            )
    except OSError:
        return False


def resolve_dtype(name):
    """The Keras dtype policy of `--dtype`, with `auto` resolved.

    bfloat16 pays on CPUs with AMX tiles and TF's oneDNN kernels (without
    them bfloat16 is emulated and slower); GPUs keep float32 unless asked,
    as mixed precision there is not measured on this project's machines.
    """
    if name != "auto":
        return name
    onednn = os.environ.get("TF_ENABLE_ONEDNN_OPTS", "1").lower()
    if (
        onednn not in ("0", "false")
        and not tf.config.list_physical_devices("GPU")
        and cpu_has_amx_bf16()
    ):
        return "mixed_bfloat16"
    return "float32"


def set_horovod_defaults():
    """A 5 ms Horovod cycle on CPU-only machines (before `hvd.init`).

    Horovod's background thread wakes every HOROVOD_CYCLE_TIME ms; at its
    1 ms default it takes CPU from ranks that share the cores (2 ranks on 2
    cores: 1.52x -> 1.73x one rank, bench/README.md). An explicit
    `horovodrun --cycle-time-ms` (the same variable) still wins.
    """
    if not tf.config.list_physical_devices("GPU"):
        os.environ.setdefault("HOROVOD_CYCLE_TIME", "5")


def apply_performance_flags():
    """Sets thread pools and the dtype policy; returns the policy name.

    Must run before TensorFlow initialises its runtime (thread pools are
    fixed then).
    """
    tf.config.threading.set_intra_op_parallelism_threads(FLAGS.intra_op_threads)
    tf.config.threading.set_inter_op_parallelism_threads(FLAGS.inter_op_threads)
    set_horovod_defaults()
    policy = resolve_dtype(FLAGS.dtype)
    keras.config.set_dtype_policy(policy)
    return policy


def define_finetune_flags():
    """Presets, model variants and ImageNet fine-tuning."""
    flags.DEFINE_enum(
        "preset",
        None,
        sorted(PRESETS),
        "Hyperparameters of a course "
        "assignment (docs/recipes.md); flags given explicitly still win.",
    )
    flags.DEFINE_enum(
        "stem",
        None,
        ["imagenet", "cifar"],
        "resnet18/34/50: 7x7/2 conv + "
        "max pool (ImageNet, default) or 3x3/1 conv (small images).",
    )
    flags.DEFINE_float(
        "dropout_rate", None, "course_resnet: dropout after the first conv."
    )
    flags.DEFINE_string(
        "pretrained",
        "",
        "Start from ImageNet weights: 'imagenet' (Keras' "
        "ResNet50 file in ~/.keras/models/, resnet50 only) or a local "
        "torchvision state dict (.pth/.npz/.safetensors, resnet18/34/50). "
        "The classifier is re-initialised for the dataset's classes.",
    )
    flags.DEFINE_float(
        "freeze_backbone_epochs",
        0,
        "Train only the classifier for this "
        "many epochs (backbone BatchNorm in inference mode), then everything.",
    )
    flags.DEFINE_float(
        "backbone_lr_multiplier",
        1.0,
        "Learning rate of everything but the "
        "classifier, relative to --learning_rate.",
        lower_bound=0.0,
    )


# Starting points for the course's assignments; docs/recipes.md says why.
PRESETS = {
    "course_cifar100": {
        "dataset": "cifar100",
        "model": "course_resnet",
        "train_epochs": 60,
        "batch_size": 128,
        "learning_rate": 0.1,
        "warmup_epochs": 2,
        "lr_decay_fractions": ["0.5", "0.75"],
        "weight_decay": 5e-4,
    },
    "course_tinyimagenet": {
        "dataset": "tinyimagenet",
        "model": "course_resnet",
        "train_epochs": 40,
        "batch_size": 128,
        "learning_rate": 0.1,
        "warmup_epochs": 2,
        "lr_decay_fractions": ["0.5", "0.75"],
        "weight_decay": 5e-4,
    },
    "resnet18_cifar100": {
        "dataset": "cifar100",
        "model": "resnet18",
        "stem": "imagenet",
        "image_size": 224,
        "train_epochs": 10,
        "batch_size": 128,
        "learning_rate": 0.01,
        "lr_decay_fractions": ["0.5", "0.75"],
        "weight_decay": 5e-4,
        "freeze_backbone_epochs": 1,
        "backbone_lr_multiplier": 0.1,
    },
}


def apply_preset():
    """Gives the flags left at their defaults the values of `--preset`."""
    if not FLAGS.preset:
        return
    for name, value in PRESETS[FLAGS.preset].items():
        try:
            FLAGS.set_default(name, value)
        except flags.Error as error:
            raise UserInputError(f"--preset={FLAGS.preset}: {error}") from None
    if FLAGS.freeze_backbone_epochs and not FLAGS.pretrained:
        raise UserInputError(
            f"--preset={FLAGS.preset} fine-tunes ImageNet weights: pass "
            "--pretrained=PATH (e.g. torchvision's resnet18-f37072fd.pth)"
        )


def finetune_model_options():
    """Model options from --stem/--dropout_rate, checked against --model."""
    options = {}
    if FLAGS.stem:
        if FLAGS.model not in ("resnet18", "resnet34", "resnet50"):
            raise UserInputError(
                f"--stem is for resnet18/34/50, not {FLAGS.model}"
            )
        options["stem"] = FLAGS.stem
    if FLAGS.dropout_rate is not None:
        if FLAGS.model != "course_resnet":
            raise UserInputError(
                f"--dropout_rate is for course_resnet, not {FLAGS.model}"
            )
        options["dropout_rate"] = FLAGS.dropout_rate
    return options


def define_distribution_flags():
    """How replicas, processes and machines share the work."""
    flags.DEFINE_enum(
        "distribution",
        "auto",
        list(DISTRIBUTIONS),
        "How replicas combine: auto "
        "(mirrored when several devices, else default).",
    )
    flags.DEFINE_integer(
        "num_gpus", 0, "GPUs of this machine to use (MirroredStrategy when >1)."
    )
    flags.DEFINE_integer(
        "cpu_replicas",
        1,
        "Split the CPU into N logical devices (to exercise "
        "MirroredStrategy without GPUs).",
    )
    flags.DEFINE_integer(
        "average_every",
        1,
        "--distribution=averaging: local steps per rank "
        "between weight averages (1: synchronous SGD at 1/ranks of the rate).",
        lower_bound=1,
    )
    # Parameter-server cluster (the names of TF1's distributed flags);
    # without them --distribution=parameter_server reads TF_CONFIG.
    flags.DEFINE_list("ps_hosts", [], "host:port of each parameter server.")
    flags.DEFINE_list("worker_hosts", [], "host:port of each worker.")
    flags.DEFINE_enum(
        "job_name",
        None,
        ["chief", "ps", "worker"],
        "This process's task: "
        "ps and worker serve until killed; chief (default) trains.",
    )
    flags.DEFINE_integer(
        "task_index", 0, "Index of this task within --job_name.", lower_bound=0
    )


def define_all():
    """Every flag group of resnet_main.py."""
    define_data_flags()
    define_run_flags()
    define_training_flags()
    define_finetune_flags()
    define_distribution_flags()
    define_performance_flags()


def check_flags():
    """Rejects contradictory flags with one clear message."""
    if FLAGS.eval_once and FLAGS.mode != "eval":
        raise UserInputError("--eval_once only makes sense with --mode=eval")
    if FLAGS.data_source == "tfds":
        if FLAGS.train_data_path or FLAGS.eval_data_path:
            raise UserInputError(
                "--data_source=tfds reads --tfds_data_dir; drop "
                "--train_data_path/--eval_data_path"
            )
    elif FLAGS.mode == "train" and not FLAGS.train_data_path:
        raise UserInputError("--mode=train needs --train_data_path")
    elif not FLAGS.eval_data_path:
        raise UserInputError(
            "--eval_data_path is required (evaluation runs in both modes)"
        )
    if FLAGS.batch_size <= 0:
        raise UserInputError(
            f"--batch_size must be positive, got {FLAGS.batch_size}"
        )
    if FLAGS.sync_bn and FLAGS.distribution in ("horovod", "averaging"):
        # Keras' synchronized BN all-reduces over tf.distribute replicas only;
        # under Horovod it would silently normalise each rank on its own.
        raise UserInputError(
            f"--sync_bn is not supported with --distribution="
            f"{FLAGS.distribution}: it synchronises tf.distribute replicas "
            "only (BN moving statistics are still averaged over ranks)"
        )


def config_from_flags():
    """A `TrainConfig` from the parsed flags."""
    apply_preset()
    check_flags()
    model_options = finetune_model_options()
    if FLAGS.shortcut:
        model_options["shortcut"] = FLAGS.shortcut
    if FLAGS.sync_bn:
        model_options["sync_bn"] = True
    return TrainConfig(
        dataset=FLAGS.dataset,
        train_data_path=(
            FLAGS.train_data_path or FLAGS.eval_data_path or FLAGS.tfds_data_dir
        ),
        eval_data_path=FLAGS.eval_data_path or FLAGS.tfds_data_dir,
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
        steps_per_run=FLAGS.steps_per_run,
        shuffle_buffer=FLAGS.shuffle_buffer,
        pretrained=FLAGS.pretrained,
        freeze_backbone_epochs=FLAGS.freeze_backbone_epochs,
        backbone_lr_multiplier=FLAGS.backbone_lr_multiplier,
        xla=FLAGS.xla,
    )
