"""Reusable absl flag groups, in the manner of official/utils/flags.

The names and meanings of the original tensorflow/models `resnet_main.py`
and of the Ray ResNet example are kept: `--dataset --mode --train_data_path
--eval_data_path --log_root --train_dir --eval_dir --eval_batch_count
--eval_once --num_gpus --image_size`.
"""

from absl import flags

from tf_resnet import config as config_lib
from tf_resnet import data, models

FLAGS = flags.FLAGS


def define_data_flags():
    """Which dataset, where its files are and how it is read."""
    flags.DEFINE_enum("dataset", "cifar10", sorted(data.DATASETS), "Dataset.")
    flags.DEFINE_enum(
        "data_source",
        None,
        ["binary", "pickle", "tfds", "folder"],
        "On-disk format; default: inferred (folder for "
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
    flags.DEFINE_bool(
        "shuffle",
        True,
        "Each training epoch a new permutation of the whole training split; "
        "--noshuffle reads it in file order (for checks).",
    )


def define_run_flags():
    """Train or eval, where outputs go, how often to log/eval/checkpoint."""
    flags.DEFINE_enum(
        "mode",
        "train",
        list(config_lib.MODES),
        "train, eval (the separate evaluation job) or export (the run's "
        "model as a SavedModel and a .keras file in --export_dir).",
    )
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
    flags.DEFINE_string(
        "export_dir",
        "",
        "--mode=export: directory to write the SavedModel, model.keras, "
        "labels.txt and export.json to.",
    )
    flags.DEFINE_string(
        "checkpoint",
        "",
        "--mode=export: checkpoint to export, e.g. LOG_ROOT/ckpt-2000 "
        "(default: the latest in --log_root).",
    )
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
    flags.DEFINE_float(
        "warmup_fraction",
        0,
        "Warm-up as a fraction of the run, when --warmup_epochs is 0.",
    )
    flags.DEFINE_float(
        "head_lr_multiplier",
        1.0,
        "Learning rate of the classifier (the `logits` layer), relative to "
        "--learning_rate.",
        lower_bound=0.0,
    )
    flags.DEFINE_float("momentum", 0.9, "SGD momentum.")
    flags.DEFINE_float("weight_decay", 1e-4, "L2 weight decay on kernels.")


def define_recipe_flags():
    """The training recipe beyond the paper's (docs/recipes.md)."""
    flags.DEFINE_enum(
        "recipe",
        "paper",
        sorted(config_lib.RECIPES),
        "A group of the recipe flags below: paper (the original step "
        "schedule) or fast (short budgets). Flags given explicitly win.",
    )
    flags.DEFINE_enum(
        "lr_schedule",
        "step",
        list(config_lib.LR_SCHEDULES),
        "step: /--lr_decay_rate at --lr_decay_fractions; cosine; onecycle "
        "(linear up over --warmup_epochs, linear down). All end at "
        "--final_lr_fraction of the peak (cosine, onecycle).",
    )
    flags.DEFINE_float(
        "final_lr_fraction",
        0.0,
        "cosine/onecycle: the rate at the last step, as a fraction of peak.",
    )
    flags.DEFINE_bool("nesterov", False, "Nesterov momentum.")
    flags.DEFINE_float(
        "label_smoothing", 0.0, "Label smoothing of the training loss."
    )
    flags.DEFINE_float(
        "ema_decay",
        0.0,
        "Exponential moving average of the weights and BN statistics with "
        "this decay (0: off); evaluated and exported instead of the raw "
        "weights.",
    )
    flags.DEFINE_enum(
        "eval_tta",
        "none",
        list(config_lib.EVAL_TTA),
        "Test-time augmentation: flip = mean of the logits of the image and "
        "its mirror (evaluation and export).",
    )
    flags.DEFINE_enum(
        "normalization",
        "per_image",
        list(config_lib.NORMALIZATIONS),
        "per_image standardisation, or the dataset's per-channel mean/std.",
    )
    flags.DEFINE_float("mixup_alpha", 0.0, "Mixup Beta(alpha, alpha); 0: off.")
    flags.DEFINE_float(
        "cutmix_alpha", 0.0, "CutMix Beta(alpha, alpha); 0: off."
    )
    flags.DEFINE_integer("cutout_size", 0, "Cutout square side; 0: off.")
    flags.DEFINE_bool(
        "zero_init_residual",
        False,
        "Initialise the last BatchNorm gamma of each residual block at 0.",
    )


def define_performance_flags():
    """Speed settings; bench/README.md has the measurements behind them."""
    flags.DEFINE_enum(
        "dtype",
        "auto",
        list(config_lib.DTYPES),
        "Keras dtype policy. auto: mixed_bfloat16 on a CPU-only machine "
        "whose CPU computes bfloat16 natively (AMX-BF16 or AVX512-BF16: "
        "faster at the same accuracy, bench/README.md), else float32. "
        "mixed_float16 (GPU) adds loss scaling; "
        "float64 is for numerical verification.",
    )
    flags.DEFINE_bool(
        "xla",
        False,
        "Compile the forward and backward pass with XLA. Off "
        "by default: much slower on CPU (XLA's CPU convolutions bypass "
        "oneDNN, bench/README.md); worth trying on GPUs.",
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


def define_finetune_flags():
    """Presets, model variants and ImageNet fine-tuning."""
    flags.DEFINE_enum(
        "preset",
        None,
        sorted(config_lib.PRESETS),
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


def define_distribution_flags():
    """How replicas, processes and machines share the work."""
    flags.DEFINE_enum(
        "distribution",
        "auto",
        list(config_lib.DISTRIBUTIONS),
        "How replicas combine. auto: horovod when started by horovodrun/"
        "mpirun with several ranks, parameter_server for the coordinator "
        "of a TF_CONFIG cluster with ps tasks, multi_worker in a TF_CONFIG "
        "cluster of several workers without ps, else mirrored when several "
        "devices, else default.",
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
    flags.DEFINE_list(
        "worker_hosts",
        [],
        "host:port of each worker (parameter_server and multi_worker).",
    )
    flags.DEFINE_enum(
        "job_name",
        None,
        ["chief", "ps", "worker"],
        "This process's task: "
        "ps and worker serve until killed; chief (default) trains.",
    )
    flags.DEFINE_integer(
        "task_index",
        0,
        "Index of this task within --job_name (multi_worker: within "
        "--worker_hosts; 0 is the chief).",
        lower_bound=0,
    )
    flags.DEFINE_float(
        "collective_timeout_secs",
        300.0,
        "--distribution=multi_worker: how long one all-reduce may wait for "
        "the other workers before this one fails (a dead peer must not hang "
        "the job; raise it if the first step compiles for longer).",
    )


def define_all():
    """Every flag group of resnet_main.py."""
    define_data_flags()
    define_run_flags()
    define_training_flags()
    define_recipe_flags()
    define_finetune_flags()
    define_distribution_flags()
    define_performance_flags()


def config_from_flags():
    """The run's `config.Config` from the parsed flags, layered, validated.

    Flags given on the command line win over `--preset` and over the saved
    configuration of the run in `--log_root` (`config.resolve`).
    """
    values = {name: FLAGS[name].value for name in config_lib.FIELD_NAMES}
    explicit = {name for name in config_lib.FIELD_NAMES if FLAGS[name].present}
    return config_lib.resolve(values, explicit)
