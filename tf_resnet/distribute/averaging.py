"""Periodic weight averaging (local SGD), the Ray ResNet example's algorithm.

`--distribution=averaging --average_every=N`: every process trains on its
own shard of the data with its own optimizer, with no gradient all-reduce,
for N steps; then the weights, the BatchNorm moving statistics and the
optimizer's momentum slots are replaced by their mean over the processes in
one all-reduce, and every process continues from that mean.

The momentum slots are averaged too: otherwise each process's momentum
keeps pushing it along its own shard's direction after every average, and
the chief's checkpoint would hold only its own momentum. With N=1 the run
is then exactly synchronous momentum SGD on every process, weights and
slots (the mean of the updates is the update of the mean gradient). The
step counter is identical everywhere and is left alone.

Each process's step is an ordinary update on its own
`global_batch / processes` examples, so the learning rate is scaled by
that per-process batch (`replicas_per_update = 1`): with N=1 the run equals
synchronous SGD at `1/processes` of its learning rate. Pass
`--learning_rate` times the number of processes to get the global-batch
rate that local-SGD papers use.

Two engines carry the all-reduce; only it differs (`LocalSteps` is the
rest), and how the processes were started picks it:

* TensorFlow's collectives (`multi_worker.MultiWorkerAveragingMode`) when
  the process is a worker of a multi-worker cluster: `--worker_hosts`, or
  a `TF_CONFIG` of several workers and no ps, as
  `python -m tf_resnet.launch.multi_worker` sets;
* Horovod (`horovod_mode.HorovodAveragingMode`) otherwise: under
  `horovodrun` / `python -m tf_resnet.launch.horovod`.

Either way one process holds one replica: `tf.distribute.MirroredStrategy`
keeps one mirrored variable per weight, which cannot hold a different
value on each replica between averages. So `--num_gpus=N` in one process
is refused with the launcher command that runs N processes instead.
"""

import importlib.util
import os
import shlex
import sys

from tf_resnet import config as config_lib
from tf_resnet.errors import UserInputError

_FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")


def float_variables(variables):
    """The floating-point variables (not step counters or RNG states)."""
    return [v for v in variables if v.dtype in _FLOAT_DTYPES]


class LocalSteps:
    """Local steps, weights averaged every `average_every`: engine-free.

    A mixin before an engine's mode class, which supplies the processes'
    data shards, metrics and `average_in_place(variables)`, the one
    all-reduce that differs between engines.
    """

    name = "averaging"

    def __init__(self, global_batch, average_every):
        super().__init__(global_batch)
        self.average_every = average_every
        self.replicas_per_update = 1

    def all_reduce_gradients(self, grads):
        """Unchanged: every process updates on its own gradients."""
        return grads

    def after_step(self, step, state):
        """Every `average_every` steps: weights, BN stats, slots to the mean."""
        if step % self.average_every == 0:
            self.average_in_place(float_variables(state.variables))

    def synchronize(self, state):
        """Averages all weights: between averages they differ per process."""
        self.average_in_place(
            float_variables([*state.model.variables, *state.averages])
        )


def engine(config):
    """`multi_worker` in a multi-worker cluster, else `horovod`; and why."""
    ranks, variable = config_lib.launcher_world_size()
    if ranks > 1:
        return "horovod", f"one of {ranks} ranks ({variable})"
    if config.worker_hosts:
        return "multi_worker", "--worker_hosts"
    workers = config_lib.tf_config_workers()
    if workers > 1:
        return "multi_worker", f"TF_CONFIG names {workers} workers"
    return "horovod", "no multi-worker cluster"


def launcher_commands(processes, argv=None):
    """The launcher command lines that run `argv` as `processes` processes.

    `argv` (default `sys.argv`) without `--num_gpus`/`--cpu_replicas`,
    behind each launcher; the Horovod one only where Horovod is installed.
    """
    argv = sys.argv if argv is None else argv
    flags, skip = [], False
    for arg in argv[1:]:
        if skip:
            skip = False
        elif arg in ("--num_gpus", "--cpu_replicas"):
            skip = True  # `--num_gpus 4`: its value follows.
        elif not arg.startswith(("--num_gpus=", "--cpu_replicas=")):
            flags.append(arg)
    if not any(f.startswith("--distribution") for f in flags):
        flags.append("--distribution=averaging")
    main = os.path.basename(argv[0]) if argv else "resnet_main.py"
    main_flag = [] if main == "resnet_main.py" else [f"--main={argv[0]}"]
    launchers = ["multi_worker"]
    if importlib.util.find_spec("horovod") is not None:
        launchers.append("horovod")
    prefix = ["python", "-m"]
    return [
        shlex.join(
            [*prefix, f"tf_resnet.launch.{launcher}", f"--np={processes}"]
            + [*main_flag, "--", *flags]
        )
        for launcher in launchers
    ]


def make_mode(config, global_batch):
    """The averaging mode on the engine `engine` picks.

    Raises:
      UserInputError: `average_every` < 1, or several devices asked of one
        process (the message names the launcher commands to run instead).
    """
    if config.average_every < 1:
        raise UserInputError(
            f"--average_every must be at least 1, got {config.average_every}"
        )
    devices = max(config.num_gpus, config.cpu_replicas)
    if devices > 1:
        raise UserInputError(
            f"--distribution=averaging trains one process per device, not "
            f"{devices} devices in one process: run "
            + " or ".join(launcher_commands(devices))
        )
    name, _ = engine(config)
    if name == "multi_worker":
        from tf_resnet.distribute import multi_worker

        return multi_worker.make_averaging_mode(config, global_batch)
    from tf_resnet.distribute import horovod_mode

    return horovod_mode.HorovodAveragingMode(global_batch, config.average_every)
