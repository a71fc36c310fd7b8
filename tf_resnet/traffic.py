"""What an engine sends over the network for one update: its scaling facts.

Each engine's `Engine.traffic` is one of the objects below; the scaling
model (`tf_resnet.scaling`) asks it how long one update's communication
takes on a cluster and how much of it the computation cannot hide. It
imports nothing of TensorFlow: the engine registry holds these.

A cluster is `Cluster`: nodes of `gpus_per_node` GPUs, each node with one
link to the network. A synchronous all-reduce across nodes is
hierarchical, as NCCL's and Horovod's are: inside a node over its own
interconnect, between nodes a ring over the node links, so a node link
carries `2(N-1)/N` times the bytes for N nodes.
"""

import dataclasses


@dataclasses.dataclass(frozen=True)
class Link:
    """Bandwidth (bytes/s, achieved) and per-message latency (seconds)."""

    bandwidth: float
    latency: float


@dataclasses.dataclass(frozen=True)
class Cluster:
    """Where the processes are.

    Attributes:
      gpus: processes in all (one GPU each).
      gpus_per_node: how many share a node and its link.
      network: the node links (`Link`).
      node: the links inside a node (`Link`).
      ps_tasks: parameter servers, each on a node of its own (None: as
        many as the worker nodes).
    """

    gpus: int
    gpus_per_node: int
    network: Link
    node: Link
    ps_tasks: int | None = None

    @property
    def nodes(self):
        return max(1, -(-self.gpus // self.gpus_per_node))

    @property
    def per_node(self):
        return min(self.gpus, self.gpus_per_node)


def ring_seconds(nbytes, processes, link, messages=1):
    """Ring all-reduces: `messages * 2(p-1) a + 2(p-1)/p * n / B`.

    `nbytes` in all, split into `messages` all-reduces (packs), each
    paying the latency of its `2(p-1)` rounds.
    """
    p = processes
    if p <= 1:
        return 0.0
    rounds = 2 * (p - 1) * messages
    return rounds * link.latency + 2 * (p - 1) / p * nbytes / link.bandwidth


def all_reduce_seconds(nbytes, cluster, messages=1):
    """A hierarchical all-reduce of `nbytes` on every GPU of `cluster`."""
    inside = ring_seconds(nbytes, cluster.per_node, cluster.node, messages)
    between = ring_seconds(nbytes, cluster.nodes, cluster.network, messages)
    return inside + between


@dataclasses.dataclass(frozen=True)
class Knobs:
    """The settings that change what crosses the network.

    Attributes:
      compression: bytes per all-reduced value over 4 (0.5: float16).
      pack_bytes: `--all_reduce_pack_bytes` (0: one message).
      accumulate_steps: micro-batches per update (`--accumulate_steps`).
      average_every: k of `--distribution=averaging`.
      overlap: the fraction of the backward pass the communication can
        hide behind (0: it starts after the backward pass, as here).
    """

    compression: float = 1.0
    pack_bytes: int = 0
    accumulate_steps: int = 1
    average_every: int = 1
    overlap: float = 0.0


# The backward pass is about two thirds of a step (twice the forward).
BACKWARD_SHARE = 2 / 3


class AllReduceEveryStep:
    """Synchronous SGD: the gradients all-reduced once per update."""

    summary = "the gradients, all-reduced once per update"
    synchronous = True

    def exposed_seconds(self, gradient_bytes, compute, cluster, knobs):
        """Communication per update that the computation does not hide.

        Args:
          gradient_bytes: float32 bytes of the trainable variables.
          compute: one micro-batch's step without communication, seconds.
          cluster: a `Cluster`.
          knobs: `Knobs`.
        """
        nbytes = gradient_bytes * knobs.compression
        packs = -(-nbytes // knobs.pack_bytes) if knobs.pack_bytes else 1
        comm = all_reduce_seconds(nbytes, cluster, packs)
        hidden = knobs.overlap * BACKWARD_SHARE * compute
        return max(0.0, comm - hidden)


class AllReduceEvery:
    """Local SGD: weights and momentum all-reduced every `average_every`."""

    summary = "weights and momentum, all-reduced every k updates"
    synchronous = False

    def exposed_seconds(self, gradient_bytes, compute, cluster, knobs):
        del compute
        state_bytes = 2 * gradient_bytes  # Weights and momentum slots.
        return all_reduce_seconds(state_bytes, cluster) / knobs.average_every


class PushPull:
    """Asynchronous SGD: each worker pulls the weights and pushes gradients.

    A worker pulls the weights, computes, then pushes its gradients: both
    wait on its node's link, which its node's GPUs share, and on the ps
    links, which every worker shares (the variables sharded over the ps
    tasks). Transfers are taken to coincide (the worst case, and what the
    measurements show): the busier of the two links sets the wait.
    """

    summary = "the weights pulled and the gradients pushed, every update"
    synchronous = False

    def exposed_seconds(self, gradient_bytes, compute, cluster, knobs):
        del compute, knobs
        ps_tasks = cluster.ps_tasks or cluster.nodes
        sharing = max(cluster.per_node, cluster.gpus / ps_tasks)
        return 2 * sharing * gradient_bytes / cluster.network.bandwidth


ALL_REDUCE_EVERY_STEP = AllReduceEveryStep()
ALL_REDUCE_EVERY = AllReduceEvery()
PUSH_PULL = PushPull()
