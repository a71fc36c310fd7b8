"""Which devices each process uses: one plan for every engine.

`plan` decides, from what the process sees of its node, which of the GPUs
TensorFlow lists it takes (or how many logical CPU devices it makes). It
is a pure function, so every case (4 GPUs, 8 GPUs on each of 2 nodes, 4
workers sharing 2 GPUs, `CUDA_VISIBLE_DEVICES=3,5`, Slurm's variables) is
tested as a table on any machine; `runtime.apply_plan` is the one small
step that hands it to TensorFlow.

Each engine names its rule in its record (`Devices`, here), and start-up
hands the rule of the engine it resolved to `plan`:

* `ASKED` (one process): the `--num_gpus` first GPUs, none with
  `--num_gpus=0` (the original example's flag: the CPU, split into
  `--cpu_replicas` logical devices if asked);
* `RANK` (one process per device): the GPU of the local rank;
* `NODE`: all the node's GPUs for one process per node (or its
  `--num_gpus` first), one GPU per process (by local rank) when several
  share the node;
* `WORKER_TASKS`: worker tasks as `NODE`; the coordinator and the ps tasks
  none;
* no GPU: the CPU, always.

Imports no TensorFlow.
"""

import dataclasses
import enum

from tf_resnet.errors import UserInputError


class Devices(enum.Enum):
    """Which devices each process of an engine takes (`plan`)."""

    # One process: the `--num_gpus` first GPUs (none: the CPU, split
    # into `--cpu_replicas` logical devices if asked).
    ASKED = "asked"
    # One process per device: the GPU of the local rank.
    RANK = "rank"
    # One process per node takes all its GPUs (or its `--num_gpus`
    # first); one GPU per process when several share the node.
    NODE = "node"
    # Worker tasks as `NODE`; the coordinator and ps tasks none.
    WORKER_TASKS = "worker tasks"


@dataclasses.dataclass(frozen=True)
class Node:
    """What a process sees of its node.

    Attributes:
      gpu_ids: the GPUs TensorFlow lists, in its order, by CUDA's numbers
        (`detect.gpu_ids`): `("3", "5")` under `CUDA_VISIBLE_DEVICES=3,5`.
      local_rank: this process's index among the job's processes here.
      local_size: the job's processes on this node.
      source: who said so (`detect.local_process`), for messages.
    """

    gpu_ids: tuple = ()
    local_rank: int = 0
    local_size: int = 1
    source: str = "one process"


@dataclasses.dataclass(frozen=True)
class Plan:
    """The devices of one process.

    Attributes:
      gpus: indices into TensorFlow's list of GPUs, the ones it keeps
        visible (then numbered `/gpu:0...`).
      cpu_replicas: logical CPU devices to make (1: the CPU as it is).
      gpu_ids: CUDA's numbers of the kept GPUs.
      why: one line on how the plan follows from the engine and the node.
    """

    gpus: tuple = ()
    cpu_replicas: int = 1
    gpu_ids: tuple = ()
    why: str = ""

    @property
    def replicas(self):
        """Replicas this process runs: one per device it keeps."""
        return len(self.gpus) or self.cpu_replicas

    @property
    def device_names(self):
        """What to replicate over in one process; None: the default device."""
        if self.gpus:
            return [f"/gpu:{index}" for index in range(len(self.gpus))]
        if self.cpu_replicas > 1:
            return [f"/cpu:{index}" for index in range(self.cpu_replicas)]
        return None

    def describe(self):
        """`GPU 0, 1 (CUDA 3, 5)`, or `CPU` / `CPU as 2 logical devices`."""
        if self.gpus:
            local = ", ".join(str(i) for i in range(len(self.gpus)))
            return f"GPU {local} (CUDA {', '.join(self.gpu_ids)})"
        if self.cpu_replicas > 1:
            return f"CPU as {self.cpu_replicas} logical devices"
        return "CPU"


def _gpus(node, indices, why):
    indices = tuple(indices)
    return Plan(indices, 1, tuple(node.gpu_ids[i] for i in indices), why)


def plan(rule, num_gpus=0, cpu_replicas=1, node=Node(), server_job=None):
    """The devices of one process on `node`, by its engine's `rule`.

    Args:
      rule: the engine's `Devices` (`startup.devices_rule`: `auto` counts
        as one process, the rule of the engines it falls back to).
      num_gpus: `--num_gpus` (0: as the engine's rule says).
      cpu_replicas: `--cpu_replicas`.
      node: what the process sees (`Node`).
      server_job: `ps` or `worker` for a parameter-server task that only
        serves, else None.

    Returns:
      A `Plan`.

    Raises:
      UserInputError: more GPUs asked for than visible, or more processes
        on the node than GPUs to give each its own.
    """
    visible = len(node.gpu_ids)
    if num_gpus > visible:
        raise UserInputError(
            f"--num_gpus={num_gpus} but {visible} GPU(s) are visible to "
            "TensorFlow"
        )
    if rule is Devices.WORKER_TASKS and server_job != "worker":
        role = f"{server_job} task" if server_job else "coordinator"
        return Plan(why=f"a parameter-server {role} computes nothing")
    if not visible:
        return Plan(cpu_replicas=cpu_replicas, why="no GPU visible")
    # One process per device, or one per node that takes all its GPUs
    # unless several share the node.
    per_node = rule in (Devices.NODE, Devices.WORKER_TASKS)
    if rule is Devices.RANK or (per_node and node.local_size > 1):
        if node.local_size > visible:
            raise UserInputError(
                f"{node.local_size} processes on this node ({node.source}) "
                f"but only {visible} GPU(s): start at most one per GPU"
            )
        return _gpus(
            node,
            [node.local_rank],
            f"one GPU per process: local rank {node.local_rank} of "
            f"{node.local_size} ({node.source})",
        )
    if per_node:
        count = num_gpus or visible
        return _gpus(node, range(count), "one process on this node")
    if num_gpus:
        return _gpus(node, range(num_gpus), f"--num_gpus={num_gpus}")
    return Plan(
        cpu_replicas=cpu_replicas,
        why="--num_gpus=0: the CPU (the GPUs stay unused)",
    )
