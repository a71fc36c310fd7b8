"""The one configuration of a run: filled once, validated once, saved once.

Every flag of `resnet_main.py` is a field of one group below, under the
flag's own name, so filling the config from the flags is a loop, not a
hand-copied list. Values are layered, each layer winning over the ones
before it:

  field defaults < `--preset` < the run's saved `config.json` < flags given
  on the command line.

The saved layer is what lets a resumed run, the separate `--mode=eval` job
and export read the run's own settings instead of re-deriving them: only
the groups that define the model and its training (`CARRIED`) are taken
from it; where this process runs and what it does now are its own.

This module imports no TensorFlow, so launchers and tools can read a run's
configuration cheaply.
"""

import dataclasses
import json
import math
import os

from tf_resnet.errors import UserInputError

CONFIG_FILE = "config.json"

DISTRIBUTIONS = (
    "auto",
    "default",
    "mirrored",
    "horovod",
    "averaging",
    "parameter_server",
    "multi_worker",
)
# One process per replica, started by horovodrun/mpirun.
HOROVOD_DISTRIBUTIONS = ("horovod", "averaging")
SERVER_JOBS = ("ps", "worker")
MODES = ("train", "eval", "export")
DTYPES = ("auto", "float32", "float64", "mixed_bfloat16", "mixed_float16")
LR_SCHEDULES = ("step", "cosine", "onecycle")
EVAL_TTA = ("none", "flip")
NORMALIZATIONS = ("per_image", "dataset")
# Variables of the process launchers that make a Horovod rank: horovodrun
# (Gloo) sets HOROVOD_*, Open MPI OMPI_COMM_WORLD_*, MPICH/Intel MPI PMI_*.
_RANK_SIZE_VARIABLES = ("HOROVOD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")


@dataclasses.dataclass
class DataConfig:
    """Which dataset, where its files are and how they are read."""

    dataset: str = "cifar10"
    data_source: str | None = None  # None: inferred from dataset and files.
    train_data_path: str = ""
    eval_data_path: str = ""
    tfds_data_dir: str = ""
    image_size: int | None = None
    shuffle: bool = True
    normalization: str = "per_image"

    def split_path(self, training):
        """The path a split is read from (TFDS reads one data dir)."""
        if self.data_source == "tfds":
            return self.tfds_data_dir
        return self.train_data_path if training else self.eval_data_path


@dataclasses.dataclass
class ModelConfig:
    """The architecture and where its weights start."""

    model: str = "resnet20"
    shortcut: str | None = None
    sync_bn: bool = False
    stem: str | None = None
    dropout_rate: float | None = None
    pretrained: str = ""
    zero_init_residual: bool = False

    @property
    def options(self):
        """Keyword options of `models.build_model` that were set."""
        options = {"shortcut": self.shortcut, "stem": self.stem}
        options["dropout_rate"] = self.dropout_rate
        options = {k: v for k, v in options.items() if v is not None}
        if self.sync_bn:
            options["sync_bn"] = True
        if self.zero_init_residual:
            options["zero_init_residual"] = True
        return options


@dataclasses.dataclass
class OptimConfig:
    """The training recipe: batch, schedule, optimizer, regularisation.

    The defaults are the paper's recipe (`--recipe=paper`).
    """

    batch_size: int = 128
    eval_batch_size: int = 0
    learning_rate: float = 0.1
    lr_schedule: str = "step"
    lr_decay_fractions: tuple = (0.5, 0.75)
    lr_decay_rate: float = 0.1
    warmup_epochs: float = 0.0
    warmup_fraction: float = 0.0
    final_lr_fraction: float = 0.0
    momentum: float = 0.9
    nesterov: bool = False
    weight_decay: float = 1e-4
    label_smoothing: float = 0.0
    ema_decay: float = 0.0
    eval_tta: str = "none"
    mixup_alpha: float = 0.0
    cutmix_alpha: float = 0.0
    cutout_size: int = 0
    freeze_backbone_epochs: float = 0.0
    backbone_lr_multiplier: float = 1.0
    head_lr_multiplier: float = 1.0

    def __post_init__(self):
        # Flags hand over lists of strings.
        self.lr_decay_fractions = tuple(
            float(f) for f in self.lr_decay_fractions
        )


@dataclasses.dataclass
class RunConfig:
    """What this invocation does, how long the run is, what it writes when."""

    mode: str = "train"
    log_root: str = "/tmp/resnet_model"
    train_dir: str = ""
    eval_dir: str = ""
    train_steps: int = 0
    train_epochs: float = 0.0
    seed: int = 0
    log_every_steps: int = 100
    eval_every_steps: int = 0
    eval_batch_count: int = 0
    eval_once: bool = False
    eval_timeout_secs: float = 3600.0
    checkpoint_every_steps: int = 0
    keep_checkpoints: int = 5
    steps_per_run: int = 0
    export_dir: str = ""
    checkpoint: str = ""

    def __post_init__(self):
        self.train_dir = self.train_dir or os.path.join(self.log_root, "train")
        self.eval_dir = self.eval_dir or os.path.join(self.log_root, "eval")


@dataclasses.dataclass
class DistributionConfig:
    """How replicas, processes and machines share the work."""

    distribution: str = "auto"
    num_gpus: int = 0
    cpu_replicas: int = 1
    average_every: int = 1
    ps_hosts: tuple = ()
    worker_hosts: tuple = ()
    job_name: str | None = None
    task_index: int = 0
    collective_timeout_secs: float = 300.0

    def __post_init__(self):
        self.ps_hosts = tuple(self.ps_hosts)
        self.worker_hosts = tuple(self.worker_hosts)

    @property
    def cluster(self):
        """Keyword arguments of `parameter_server.cluster_resolver`."""
        return {
            "ps_hosts": self.ps_hosts,
            "worker_hosts": self.worker_hosts,
            "job_name": self.job_name or "",
            "task_index": self.task_index,
        }

    @property
    def is_server_task(self):
        """A ps or worker task of a parameter-server cluster: it only serves.

        Named by `--job_name`, or by a `TF_CONFIG` whose cluster has a `ps`
        job (so one written for multi-worker all-reduce is not taken for it).
        """
        if self.job_name:
            return self.job_name in SERVER_JOBS
        tf_config = read_tf_config()
        return (
            "ps" in tf_config.get("cluster", {})
            and tf_config.get("task", {}).get("type") in SERVER_JOBS
        )


@dataclasses.dataclass
class RuntimeConfig:
    """Settings fixed when TensorFlow starts (see `tf_resnet.runtime`)."""

    dtype: str = "auto"
    xla: bool = False
    intra_op_threads: int = 0
    inter_op_threads: int = 0
    deterministic: bool = False


@dataclasses.dataclass
class Config:
    """Everything a run needs, in groups."""

    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    run: RunConfig = dataclasses.field(default_factory=RunConfig)
    distribution: DistributionConfig = dataclasses.field(
        default_factory=DistributionConfig
    )
    runtime: RuntimeConfig = dataclasses.field(default_factory=RuntimeConfig)
    preset: str | None = None
    recipe: str = "paper"

    def to_json(self):
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)


GROUPS = {
    "data": DataConfig,
    "model": ModelConfig,
    "optim": OptimConfig,
    "run": RunConfig,
    "distribution": DistributionConfig,
    "runtime": RuntimeConfig,
}
# Field name -> its group; flag names are field names.
FIELD_GROUP = {
    field.name: group
    for group, cls in GROUPS.items()
    for field in dataclasses.fields(cls)
}
TOP_LEVEL = ("preset", "recipe")
FIELD_NAMES = (*FIELD_GROUP, *TOP_LEVEL)
# What a resumed run, the eval job and export take from the saved config:
# what defines the model and its training, not where or how this process
# runs (distribution, runtime) nor what it is asked to do now.
CARRIED = frozenset(
    [
        *(f.name for f in dataclasses.fields(DataConfig)),
        *(f.name for f in dataclasses.fields(ModelConfig)),
        *(f.name for f in dataclasses.fields(OptimConfig)),
        "train_steps",
        "train_epochs",
        "seed",
        "eval_every_steps",
        "checkpoint_every_steps",
        *TOP_LEVEL,
    ]
)

# Groups of recipe fields, set by `--recipe`; docs/recipes.md says why.
RECIPES = {
    # The paper's: step decay /10 at 50% and 75%, wd 1e-4, per-image
    # standardisation. The field defaults; bit-for-bit the original.
    "paper": {},
    # Short budgets (tens of epochs): one-cycle at a high peak with
    # nesterov, strong weight decay, label smoothing, dataset mean/std, an
    # average of the weights and flip TTA; chosen with
    # bench/time_to_accuracy.py.
    "fast": {
        "lr_schedule": "onecycle",
        "learning_rate": 0.4,
        "warmup_fraction": 0.15,
        "nesterov": True,
        "weight_decay": 1e-3,
        "label_smoothing": 0.2,
        "normalization": "dataset",
        "ema_decay": 0.99,
        "eval_tta": "flip",
    },
}

# Starting points for the course's assignments; docs/recipes.md says why.
# The from-scratch ones train with the `fast` recipe, which won at their
# budgets (bench/README.md, "Time to accuracy"), and a slower classifier:
# course_resnet's globally max-pooled features are large, so at the
# recipe's rate the classifier's first updates overshoot.
PRESETS = {
    "course_cifar100": {
        "dataset": "cifar100",
        "model": "course_resnet",
        "recipe": "fast",
        "head_lr_multiplier": 0.05,
        "train_epochs": 60,
        "batch_size": 128,
    },
    "course_tinyimagenet": {
        "dataset": "tinyimagenet",
        "model": "course_resnet",
        "recipe": "fast",
        "head_lr_multiplier": 0.05,
        "train_epochs": 40,
        "batch_size": 128,
    },
    # course_cifar100 on several ranks, one all-reduced update per step:
    # a fixed global batch, so any rank count runs the same optimisation.
    # The peak is 0.4 at the global batch of 512, the fast recipe's peak at
    # 128 not scaled up a second time (docs/recipes.md says why).
    "course_sync_cifar100": {
        "dataset": "cifar100",
        "model": "course_resnet",
        "recipe": "fast",
        "head_lr_multiplier": 0.05,
        "distribution": "horovod",
        "train_epochs": 60,
        "batch_size": 512,
        "learning_rate": 0.1,
    },
    # course_cifar100 on parameter servers: each step is one worker's
    # update; less momentum, as stale gradients add momentum of their own.
    "course_async_cifar100": {
        "dataset": "cifar100",
        "model": "course_resnet",
        "recipe": "fast",
        "head_lr_multiplier": 0.05,
        "distribution": "parameter_server",
        "train_epochs": 60,
        "batch_size": 128,
        "momentum": 0.5,
    },
    "resnet18_cifar100": {
        "dataset": "cifar100",
        "model": "resnet18",
        "stem": "imagenet",
        "image_size": 224,
        "train_epochs": 10,
        "batch_size": 128,
        "learning_rate": 0.01,
        "lr_decay_fractions": (0.5, 0.75),
        "weight_decay": 5e-4,
        "freeze_backbone_epochs": 1,
        "backbone_lr_multiplier": 0.1,
    },
}


def make_config(**values):
    """A `Config` from flat field names (the flags' names).

    Raises:
      TypeError: a name that is no field.
    """
    groups = {group: {} for group in GROUPS}
    top = {name: values.pop(name) for name in TOP_LEVEL if name in values}
    for name, value in values.items():
        if name not in FIELD_GROUP:
            raise TypeError(f"unknown config field {name!r}")
        groups[FIELD_GROUP[name]][name] = value
    return Config(
        **{group: GROUPS[group](**groups[group]) for group in GROUPS}, **top
    )


def flatten(config):
    """`{field name: value}` of a `Config` (the inverse of `make_config`)."""
    flat = {name: getattr(config, name) for name in TOP_LEVEL}
    for group in GROUPS:
        flat.update(dataclasses.asdict(getattr(config, group)))
    return flat


def resolve(values, explicit):
    """Layers presets, the saved config and explicit flags; validates.

    Args:
      values: `{field name: value}` of every field, as the flags hold them
        (defaults where not given).
      explicit: names given on the command line; they win over every layer.

    Returns:
      A validated `Config`.

    Raises:
      UserInputError: an unknown preset, an unreadable saved config, or
        contradictory or out-of-range values, as one message.
    """
    values = dict(values)
    layers = []
    preset = values.get("preset")
    if preset:
        if preset not in PRESETS:
            raise UserInputError(
                f"unknown --preset={preset}; known: {', '.join(PRESETS)}"
            )
        layers.append(PRESETS[preset])
    saved = load_saved(values.get("log_root") or RunConfig.log_root)
    if saved is not None:
        layers.append({k: v for k, v in saved.items() if k in CARRIED})
    # The recipe is a layer under all others; which one is itself layered.
    recipe = values.get("recipe") or "paper"
    if "recipe" not in explicit:
        for layer in layers:
            recipe = layer.get("recipe", recipe)
    if recipe not in RECIPES:
        raise UserInputError(
            f"unknown --recipe={recipe}; known: {', '.join(RECIPES)}"
        )
    layers.insert(0, {**RECIPES[recipe], "recipe": recipe})
    for layer in layers:
        for name, value in layer.items():
            if name not in explicit:
                values[name] = value
    config = make_config(**values)
    validate(config)
    return config


def _read_saved(log_root):
    """`(path, document)` of `log_root/config.json`; document None if none."""
    path = os.path.join(log_root, CONFIG_FILE)
    if not os.path.exists(path):
        return path, None
    try:
        with open(path, encoding="utf-8") as stream:
            return path, json.load(stream)
    except (OSError, ValueError) as error:
        raise UserInputError(f"{path}: unreadable ({error})") from None


# Fields that earlier versions saved and that no longer exist: a run saved
# with them resumes without them (`shuffle_buffer` gave way to a permutation
# of the whole split every epoch).
RETIRED_FIELDS = frozenset({"shuffle_buffer"})


def load_saved(log_root):
    """The flat fields of `log_root/config.json`, `None` if there is none."""
    path, document = _read_saved(log_root)
    if document is None:
        return None
    try:
        saved = document["config"]
        return flatten(
            Config(
                **{
                    group: GROUPS[group](**_current(saved[group]))
                    for group in GROUPS
                },
                **{name: saved[name] for name in TOP_LEVEL if name in saved},
            )
        )
    except (ValueError, KeyError, TypeError) as error:
        raise UserInputError(
            f"{path}: not a readable tf-resnet run configuration ({error}); "
            "move it away to start the run's configuration afresh"
        ) from None


def _current(fields):
    return {k: v for k, v in fields.items() if k not in RETIRED_FIELDS}


def read_plan(log_root):
    """The step plan a training run saved in `log_root`, `None` if none."""
    _, document = _read_saved(log_root)
    return None if document is None else document.get("plan")


def save(config, plan, write_fn):
    """Writes `config.json` (config and step plan) with `write_fn(path, fn)`.

    `write_fn` is `summaries.atomic_write`, passed in so this module stays
    free of TensorFlow.
    """
    document = {
        "config": json.loads(config.to_json()),
        "plan": dataclasses.asdict(plan),
    }
    path = os.path.join(config.run.log_root, CONFIG_FILE)
    write_fn(
        path,
        lambda stream: json.dump(document, stream, indent=2, sort_keys=True),
    )


def read_tf_config():
    """`TF_CONFIG` as a dict (`{}` when unset)."""
    text = os.environ.get("TF_CONFIG", "").strip()
    if not text:
        return {}
    try:
        tf_config = json.loads(text)
    except json.JSONDecodeError as error:
        raise UserInputError(f"TF_CONFIG is not valid JSON: {error}") from None
    if not isinstance(tf_config, dict):
        raise UserInputError(f"TF_CONFIG must be a JSON object, got {text!r}")
    return tf_config


def tf_config_workers():
    """Workers (a chief included) of a `TF_CONFIG` cluster without ps.

    0 when `TF_CONFIG` is unset or names parameter servers: what decides
    whether a process is one worker of a multi-worker all-reduce.
    """
    cluster = read_tf_config().get("cluster", {})
    if "ps" in cluster:
        return 0
    return len(cluster.get("worker", [])) + len(cluster.get("chief", []))


def launcher_world_size():
    """`(processes, variable)` of a horovodrun/mpirun job, else `(1, None)`."""
    for variable in _RANK_SIZE_VARIABLES:
        value = os.environ.get(variable, "")
        if value.isdigit():
            return int(value), variable
    return 1, None


def resolve_distribution(distribution, preset=None):
    """The mode `--distribution` names, `auto` resolved; and why.

    `auto` looks at how the process was started: by horovodrun or mpirun
    with several ranks (their rank variables) it is `horovod`; as the
    coordinator of a `TF_CONFIG` cluster with ps tasks, `parameter_server`;
    in a `TF_CONFIG` cluster of several workers and no ps, `multi_worker`;
    otherwise `mirrored` or `default` by the devices, which only
    `make_mode` knows (returned as `auto`).

    Args:
      distribution: the resolved `--distribution` value.
      preset: the run's `--preset`, named as the reason when it set the mode.

    Returns:
      `(name, reason)`.

    Raises:
      UserInputError: a mode that contradicts the launcher (one process of
        several started by horovodrun told to train on its own).
    """
    ranks, variable = launcher_world_size()
    if ranks > 1 and distribution not in (*HOROVOD_DISTRIBUTIONS, "auto"):
        raise UserInputError(
            f"--distribution={distribution} in one of {ranks} processes "
            f"started by horovodrun/mpirun ({variable}={ranks}): each would "
            "train on its own into the same --log_root; use "
            "--distribution=horovod or averaging (or leave it at auto)"
        )
    if distribution != "auto":
        if PRESETS.get(preset, {}).get("distribution") == distribution:
            return distribution, f"--preset={preset}"
        return distribution, "--distribution"
    if ranks > 1:
        return "horovod", f"started as one of {ranks} ranks ({variable})"
    if "ps" in read_tf_config().get("cluster", {}):
        return "parameter_server", "TF_CONFIG names ps tasks"
    workers = tf_config_workers()
    if workers > 1:
        return "multi_worker", f"TF_CONFIG names {workers} workers, no ps"
    return "auto", "one process"


def _check_finite(config):
    for group in GROUPS:
        for name, value in dataclasses.asdict(getattr(config, group)).items():
            numbers = value if isinstance(value, tuple) else (value,)
            for number in numbers:
                if isinstance(number, float) and not math.isfinite(number):
                    raise UserInputError(
                        f"--{name}={value}: must be a finite number"
                    )


def validate(config):
    """Rejects contradictory or out-of-range settings with one message."""
    _check_finite(config)
    data, run, optim = config.data, config.run, config.optim
    model, dist = config.model, config.distribution
    if run.mode not in MODES:
        raise UserInputError(
            f"--mode={run.mode}: expected one of {', '.join(MODES)}"
        )
    if run.eval_once and run.mode != "eval":
        raise UserInputError("--eval_once only makes sense with --mode=eval")
    for name in ("export_dir", "checkpoint"):
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
    if dist.distribution not in DISTRIBUTIONS:
        raise UserInputError(
            f"unknown --distribution={dist.distribution}; known: "
            f"{', '.join(DISTRIBUTIONS)}"
        )
    _check_multi_worker(dist)
    if config.runtime.dtype not in DTYPES:
        raise UserInputError(
            f"unknown --dtype={config.runtime.dtype}; known: "
            f"{', '.join(DTYPES)}"
        )
    _check_choices(config)
    # Export reads the checkpoint and the saved plan, no data.
    if not dist.is_server_task and run.mode != "export":
        _check_data(data, run)
    if optim.batch_size <= 0:
        raise UserInputError(
            f"--batch_size must be positive, got {optim.batch_size}"
        )
    if model.sync_bn and dist.distribution in HOROVOD_DISTRIBUTIONS:
        # Keras' synchronized BN all-reduces over tf.distribute replicas only;
        # under Horovod it would silently normalise each rank on its own.
        raise UserInputError(
            f"--sync_bn is not supported with --distribution="
            f"{dist.distribution}: it synchronises tf.distribute replicas "
            "only (BN moving statistics are still averaged over ranks)"
        )
    if model.stem and model.model not in ("resnet18", "resnet34", "resnet50"):
        raise UserInputError(f"--stem is for resnet18/34/50, not {model.model}")
    if model.dropout_rate is not None and model.model != "course_resnet":
        raise UserInputError(
            f"--dropout_rate is for course_resnet, not {model.model}"
        )
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


def _check_multi_worker(dist):
    if dist.collective_timeout_secs <= 0:
        raise UserInputError(
            f"--collective_timeout_secs={dist.collective_timeout_secs}: "
            "must be positive"
        )
    if dist.distribution != "multi_worker":
        return
    if dist.ps_hosts or dist.job_name:
        raise UserInputError(
            "--distribution=multi_worker has no ps and no job names: drop "
            "--ps_hosts/--job_name (the cluster is --worker_hosts with "
            "--task_index, TF_CONFIG or Slurm)"
        )
    if dist.cpu_replicas > 1:
        raise UserInputError(
            "--cpu_replicas is for --distribution=mirrored; a multi_worker "
            "worker runs one replica per GPU, or one on its CPU"
        )


def _check_choices(config):
    optim = config.optim
    for name, value, choices in (
        ("lr_schedule", optim.lr_schedule, LR_SCHEDULES),
        ("eval_tta", optim.eval_tta, EVAL_TTA),
        ("normalization", config.data.normalization, NORMALIZATIONS),
    ):
        if value not in choices:
            raise UserInputError(
                f"unknown --{name}={value}; known: {', '.join(choices)}"
            )
    for name, inside, interval in (
        ("label_smoothing", lambda v: 0 <= v < 1, "[0, 1)"),
        ("ema_decay", lambda v: 0 <= v < 1, "[0, 1)"),
        ("final_lr_fraction", lambda v: 0 <= v <= 1, "[0, 1]"),
        ("warmup_fraction", lambda v: 0 <= v <= 1, "[0, 1]"),
    ):
        if not inside(getattr(optim, name)):
            raise UserInputError(
                f"--{name}={getattr(optim, name)}: must be in {interval}"
            )
    for name in ("mixup_alpha", "cutmix_alpha", "cutout_size"):
        if getattr(optim, name) < 0:
            raise UserInputError(
                f"--{name}={getattr(optim, name)}: must not be negative"
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
