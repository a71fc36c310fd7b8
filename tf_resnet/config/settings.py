"""Every setting of a run, in groups: each defined once, as a field.

Every setting is a field of one group, declared with `schema.setting`:
its default, flag help, choices and bounds are defined there and nowhere
else. `flags` generates the absl flag of the same name from the field,
`validation.validate` checks every group against the same declarations,
and `layers.resolve` fills a `Config` from its layers (the defaults,
recipes and presets, the run's saved `config.json`, the flags).

The data and model groups are declared beside the facts they choose from,
on the types their readers take: `datasets.DataConfig` (the input knobs,
`InputKnobs`, and which dataset where) and `families.ModelConfig` (the
model options, `ModelOptions`, and which model from which weights). The
other groups are declared here.

This module imports no TensorFlow, so launchers and tools can read a run's
configuration cheaply.
"""

import dataclasses
import json
import os

from tf_resnet import detect, traffic
from tf_resnet.config import engines, presets
from tf_resnet.config.datasets import DataConfig
from tf_resnet.config.families import ModelConfig
from tf_resnet.config.schema import (
    AT_LEAST_ONE,
    BELOW_ONE,
    FRACTION,
    NON_NEGATIVE,
    POSITIVE,
    setting,
)

MODES = ("train", "eval", "export")


@dataclasses.dataclass
class OptimConfig:
    """The training recipe: batch, schedule, optimizer, regularisation.

    The defaults are the paper's recipe (`--recipe=paper`).
    """

    batch_size: int = setting(
        128,
        "GLOBAL batch size: split over all replicas of all workers.",
        bounds=POSITIVE,
    )
    accumulate_steps: int = setting(
        1,
        "Micro-batches of one update: each replica's batch is split into N, "
        "run one after another within the step, and their gradients summed "
        "before the one all-reduce and update. --batch_size stays the batch "
        "of one update (schedule, epochs, learning rate unchanged); memory "
        "is that of one micro-batch. BatchNorm normalises each micro-batch "
        "with its own statistics and updates its moving statistics N times "
        "per step.",
        bounds=AT_LEAST_ONE,
    )
    eval_batch_size: int = setting(
        0, "Evaluation batch per process (0: --batch_size)."
    )
    learning_rate: float = setting(
        0.1,
        "Learning rate at batch 128; scaled linearly with the batch of one "
        "update.",
    )
    lr_schedule: str = setting(
        "step",
        "step: /--lr_decay_rate at --lr_decay_fractions; cosine; onecycle "
        "(linear up over --warmup_epochs, linear down). All end at "
        "--final_lr_fraction of the peak (cosine, onecycle).",
        choices=("step", "cosine", "onecycle"),
    )
    lr_decay_fractions: tuple = setting(
        (0.5, 0.75),
        "Fractions of the run at which the rate drops (the paper: 32k and "
        "48k of 64k steps).",
    )
    lr_decay_rate: float = setting(0.1, "Factor applied at each decay.")
    warmup_epochs: float = setting(0.0, "Linear learning-rate warm-up.")
    warmup_fraction: float = setting(
        0.0,
        "Warm-up as a fraction of the run, when --warmup_epochs is 0.",
        bounds=FRACTION,
    )
    final_lr_fraction: float = setting(
        0.0,
        "cosine/onecycle: the rate at the last step, as a fraction of peak.",
        bounds=FRACTION,
    )
    momentum: float = setting(0.9, "SGD momentum.")
    nesterov: bool = setting(False, "Nesterov momentum.")
    weight_decay: float = setting(1e-4, "L2 weight decay on kernels.")
    label_smoothing: float = setting(
        0.0, "Label smoothing of the training loss.", bounds=BELOW_ONE
    )
    ema_decay: float = setting(
        0.0,
        "Exponential moving average of the weights and BN statistics with "
        "this decay (0: off); evaluated and exported instead of the raw "
        "weights.",
        bounds=BELOW_ONE,
    )
    eval_tta: str = setting(
        "none",
        "Test-time augmentation: flip = mean of the logits of the image and "
        "its mirror (evaluation and export).",
        choices=("none", "flip"),
    )
    freeze_backbone_epochs: float = setting(
        0.0,
        "Train only the classifier for this many epochs (backbone BatchNorm "
        "in inference mode), then everything.",
    )
    backbone_lr_multiplier: float = setting(
        1.0,
        "Learning rate of everything but the classifier, relative to "
        "--learning_rate.",
        bounds=NON_NEGATIVE,
    )
    head_lr_multiplier: float = setting(
        1.0,
        "Learning rate of the classifier (the `logits` layer), relative to "
        "--learning_rate.",
        bounds=NON_NEGATIVE,
    )

    def __post_init__(self):
        # Flags hand over lists of strings.
        self.lr_decay_fractions = tuple(
            float(f) for f in self.lr_decay_fractions
        )


@dataclasses.dataclass
class RunConfig:
    """What this invocation does, how long the run is, what it writes when."""

    mode: str = setting(
        "train",
        "train, eval (the separate evaluation job) or export (the run's "
        "model as a SavedModel and a .keras file in --export_dir).",
        choices=MODES,
    )
    log_root: str = setting(
        "/tmp/resnet_model",
        "Checkpoints, eval.csv and the learning curve go here; a run resumes "
        "from its latest checkpoint.",
    )
    train_dir: str = setting(
        "", "TensorBoard train dir (default log_root/train)."
    )
    eval_dir: str = setting(
        "",
        "TensorBoard eval dir and the evaluation's reports (default "
        "log_root/eval while training; log_root/eval_job for --mode=eval, "
        "so the eval job never rewrites training's).",
    )
    train_steps: int = setting(
        0, "Optimizer steps (0: use --train_epochs, else 64000)."
    )
    train_epochs: float = setting(0.0, "Epochs, when --train_steps is 0.")
    seed: int = setting(0, "Seed of weights, shuffling and augmentation.")
    log_every_steps: int = setting(
        100, "Progress line and train summaries every N steps."
    )
    log_every_secs: float = setting(
        30.0,
        "Also a progress line when this many seconds passed without one, so "
        "a slow run is never silent for long.",
        bounds=POSITIVE,
    )
    eval_every_steps: int = setting(
        0, "Evaluate while training every N steps (0: each epoch)."
    )
    eval_batch_count: int = setting(
        0, "Evaluate only this many batches (0: all records)."
    )
    eval_once: bool = setting(
        False, "--mode=eval: evaluate the latest checkpoint once."
    )
    eval_timeout_secs: float = setting(
        3600.0, "--mode=eval: stop after this long without a new checkpoint."
    )
    checkpoint_every_steps: int = setting(
        0, "Checkpoint every N steps (0: at each evaluation)."
    )
    keep_checkpoints: int = setting(5, "Checkpoints kept in log_root.")
    steps_per_run: int = setting(
        0,
        "Stop (with a checkpoint) after this many steps in this invocation; "
        "rerun to continue. For time-sliced batch queues.",
    )
    export_dir: str = setting(
        "",
        "--mode=export: directory to write the SavedModel, model.keras, "
        "labels.txt and export.json to.",
    )
    litert: str | None = setting(
        None,
        "--mode=export: also write model.tflite (LiteRT) beside the "
        "SavedModel: float (float32 weights) or int8 (fully integer, "
        "calibrated on training images; --train_data_path overrides the "
        "run's).",
        choices=("float", "int8"),
    )
    checkpoint: str = setting(
        "",
        "--mode=export: checkpoint to export, e.g. LOG_ROOT/ckpt-2000 "
        "(default: the latest in --log_root).",
    )
    dry_run: bool = setting(
        False,
        "Print this process's engine, devices, replicas, batch, learning "
        "rate and dtype policy, then exit without reading data or writing.",
    )

    def __post_init__(self):
        self.train_dir = self.train_dir or os.path.join(self.log_root, "train")
        # The eval job's reports and events must not land on training's.
        own = "eval_job" if self.mode == "eval" else "eval"
        self.eval_dir = self.eval_dir or os.path.join(self.log_root, own)


@dataclasses.dataclass
class DistributionConfig:
    """How replicas, processes and machines share the work."""

    distribution: str = setting(
        "auto",
        "How replicas combine. auto: horovod when started by horovodrun "
        "(or mpirun) with several ranks, parameter_server for the "
        "coordinator of a TF_CONFIG cluster with ps tasks, multi_worker in "
        "a TF_CONFIG cluster of several workers without ps or a Slurm job "
        "step of several tasks, else mirrored when several devices, else "
        "default.",
        choices=engines.distributions,
    )
    num_gpus: int = setting(
        0, "GPUs of this machine to use (MirroredStrategy when >1)."
    )
    cpu_replicas: int = setting(
        1,
        "Split the CPU into N logical devices (to exercise MirroredStrategy "
        "without GPUs).",
    )
    average_every: int = setting(
        1,
        "--distribution=averaging: local steps per rank between weight "
        "averages (1: synchronous SGD at 1/ranks of the rate).",
        bounds=AT_LEAST_ONE,
    )
    # Parameter-server cluster (the names of TF1's distributed flags);
    # without them --distribution=parameter_server reads TF_CONFIG.
    ps_hosts: tuple = setting((), "host:port of each parameter server.")
    worker_hosts: tuple = setting(
        (), "host:port of each worker (parameter_server and multi_worker)."
    )
    job_name: str | None = setting(
        None,
        "This process's task: ps and worker serve (until killed, or until "
        "no data reached them for --peer_timeout_secs); chief (default) "
        "trains.",
        choices=("chief", *detect.SERVER_JOBS),
    )
    task_index: int = setting(
        0,
        "Index of this task within --job_name (multi_worker: within "
        "--worker_hosts; 0 is the chief).",
        bounds=NON_NEGATIVE,
    )
    peer_timeout_secs: float = setting(
        300.0,
        "Seconds a process of a multi-process run (horovod, averaging, "
        "multi_worker, parameter_server's coordinator) waits for its peers "
        "before it ends with exit code 4 (the Slurm jobs of scripts/ "
        "requeue on it), "
        "naming the step, the peers and the checkpoint the same command "
        "resumes from: a lost node, a cut link or a frozen peer ends the "
        "run instead of hanging it. It bounds every stretch between two "
        "steps, so it must exceed the first step's compilation, an "
        "evaluation and a checkpoint save, a peer's included "
        "(docs/reliability.md). multi_worker's collectives time out at it "
        "too.",
        bounds=POSITIVE,
    )
    gradient_compression: str = setting(
        engines.NO_COMPRESSION,
        "fp16: gradients cast to float16 for the all-reduce and back after "
        "it (Horovod's Compression.fp16): half the bytes, float16 rounding. "
        "horovod, multi_worker and mirrored.",
        choices=engines.GRADIENT_COMPRESSIONS,
    )
    all_reduce_pack_bytes: int = setting(
        0,
        "Bytes per bucket (pack, fused buffer) of the gradient all-reduce "
        "(0: the engine's default; buckets of "
        f"{traffic.DEFAULT_BUCKET_BYTES / 2**20:g} MiB). horovod and "
        "multi_worker: the buckets of the overlapped all-reduce; "
        "multi_worker: also CommunicationOptions' bytes_per_pack; horovod: "
        "also HOROVOD_FUSION_THRESHOLD, unless that is set in the "
        "environment.",
        bounds=NON_NEGATIVE,
    )
    overlap_all_reduce: bool = setting(
        True,
        "horovod and multi_worker: all-reduce the gradients in buckets, "
        "each as soon as the backward pass has produced it, so the "
        "transfers overlap the rest of the backward pass. "
        "--nooverlap_all_reduce: one all-reduce of every gradient after "
        "the backward pass.",
    )

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
        """A ps or worker task of a parameter-server cluster (`detect`)."""
        return detect.is_server_task(self.job_name)


@dataclasses.dataclass
class RuntimeConfig:
    """Settings fixed when TensorFlow starts (see `tf_resnet.runtime`)."""

    dtype: str = setting(
        "auto",
        "Keras dtype policy. auto: mixed_bfloat16 on a CPU-only machine "
        "whose CPU computes bfloat16 natively (AMX-BF16 or AVX512-BF16: "
        "faster at the same accuracy, bench/results/train_step.md), else "
        "float32. mixed_float16 (GPU) adds loss scaling; float64 is for "
        "numerical verification.",
        choices=(
            "auto",
            "float32",
            "float64",
            "mixed_bfloat16",
            "mixed_float16",
        ),
    )
    xla: bool = setting(
        False,
        "Compile the forward and backward pass with XLA. Off by default: "
        "much slower on CPU (XLA's CPU convolutions bypass oneDNN, "
        "bench/results/train_step.md); worth trying on GPUs.",
    )
    intra_op_threads: int = setting(
        0,
        "Threads one op may use (0: TensorFlow's default, one per core).",
        bounds=NON_NEGATIVE,
    )
    inter_op_threads: int = setting(
        0,
        "Ops run concurrently (0: TensorFlow's default, one per core, but "
        "two on a process of one core whose gradient all-reduce overlaps "
        "the backward pass).",
        bounds=NON_NEGATIVE,
    )
    deterministic: bool = setting(
        False,
        "tf.config.experimental.enable_op_determinism(): bit-identical runs "
        "and resumes, somewhat slower.",
    )


@dataclasses.dataclass
class Config:
    """Everything a run needs, in groups; `preset` and `recipe` layer them."""

    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    run: RunConfig = dataclasses.field(default_factory=RunConfig)
    distribution: DistributionConfig = dataclasses.field(
        default_factory=DistributionConfig
    )
    runtime: RuntimeConfig = dataclasses.field(default_factory=RuntimeConfig)
    preset: str | None = setting(
        None,
        "Hyperparameters of a course assignment (docs/recipes.md); flags "
        "given explicitly still win.",
        choices=tuple(sorted(presets.PRESETS)),
    )
    recipe: str = setting(
        "paper",
        "A group of the recipe flags: paper (the original step schedule) or "
        "fast (short budgets). Flags given explicitly win.",
        choices=tuple(sorted(presets.RECIPES)),
    )

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


def fields():
    """Every setting's `dataclasses.Field`, in group order, top level last."""
    top = [f for f in dataclasses.fields(Config) if f.name in TOP_LEVEL]
    return [
        *(f for cls in GROUPS.values() for f in dataclasses.fields(cls)),
        *top,
    ]


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
