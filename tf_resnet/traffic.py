"""What an engine sends over the network for one update: its scaling facts.

Each engine's `Engine.traffic` is one of the objects below; the scaling
model (`tf_resnet.scaling`) asks it how long one update's communication
takes on a cluster and how much of it the computation cannot hide. It
imports nothing of TensorFlow: the engine registry holds these.

A cluster is `Cluster`: nodes of `gpus_per_node` GPUs, each node with one
link to the network. A synchronous all-reduce across nodes is
hierarchical, as NCCL's and Horovod's are: inside a node over its own
interconnect, between nodes a ring over the node links, so a node link
carries `2(N-1)/N` times the bytes for N nodes. (A flat ring over all
`p` GPUs, ordered by node, crosses each node link once in and once out
and so carries about `2(p-1)/p` times the bytes: nearly the same; what
the hierarchy saves is latency, `2(N-1)` rounds between nodes against
`2(p-1)`.)

The synchronous engines all-reduce the gradients in buckets, each as the
backward pass produces it (`distribute.buckets`): `Gradients` says when
each gradient of a model appears, and `AllReduceEveryStep` schedules the
buckets on the link one at a time, each starting once its gradients exist
and the bucket before it is through.
"""

import dataclasses
import math

# The bucket size of the overlapped gradient all-reduce when
# `--all_reduce_pack_bytes` is 0: the best of those measured on emulated
# links (bench/results/network_scaling.md, "Overlapped all-reduce").
DEFAULT_BUCKET_BYTES = 2**20


def bucket_bytes(pack_bytes):
    """The bucket size `--all_reduce_pack_bytes` asks for (0: the default)."""
    return pack_bytes or DEFAULT_BUCKET_BYTES


def bucket_plan(sizes, max_bytes):
    """Buckets of tensors of `sizes` bytes: lists of indices, last first.

    Each bucket takes tensors from the end of the list until it holds more
    than `max_bytes`: the packs TensorFlow's collectives make of a reversed
    list (`cross_device_utils.group_by_size`), so the Horovod engine's
    buckets are multi_worker's packs. `None` sizes (variables without a
    gradient) are in none.
    """
    buckets, current, size = [], [], 0
    for index in reversed(range(len(sizes))):
        if sizes[index] is None:
            continue
        current.append(index)
        size += sizes[index]
        if size > max_bytes:
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets


@dataclasses.dataclass(frozen=True)
class Gradients:
    """A model's gradients, as its backward pass produces them.

    Attributes:
      sizes: float32 bytes of each trainable variable, in the model's order.
      ready: for each, the share of the backward pass done when its
        gradient exists: the backward work of its layer and of every layer
        after it, over all (`scaling.gradients_of` counts it per model).
    """

    sizes: tuple
    ready: tuple

    @classmethod
    def at_end(cls, nbytes):
        """One tensor of `nbytes`, ready when the backward pass ends."""
        return cls((nbytes,), (1.0,))

    @property
    def nbytes(self):
        return sum(self.sizes)

    def buckets(self, max_bytes):
        """`(bytes, ready)` of each bucket, in the order they are sent."""
        return [
            (
                sum(self.sizes[i] for i in bucket),
                max(self.ready[i] for i in bucket),
            )
            for bucket in bucket_plan(self.sizes, max_bytes)
        ]


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
      call_seconds: a fixed cost of every all-reduce call (its launch,
        Horovod's negotiation), calibrated on published clusters.
    """

    gpus: int
    gpus_per_node: int
    network: Link
    node: Link
    ps_tasks: int | None = None
    call_seconds: float = 0.0

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
    if cluster.gpus <= 1:
        return 0.0
    inside = ring_seconds(nbytes, cluster.per_node, cluster.node, messages)
    between = ring_seconds(nbytes, cluster.nodes, cluster.network, messages)
    return messages * cluster.call_seconds + inside + between


@dataclasses.dataclass(frozen=True)
class Knobs:
    """The settings that change what crosses the network.

    Attributes:
      compression: bytes per all-reduced value over 4 (0.5: float16).
      pack_bytes: `--all_reduce_pack_bytes` (0: one message).
      accumulate_steps: micro-batches per update (`--accumulate_steps`).
      average_every: k of `--distribution=averaging`.
      overlap: the all-reduce in buckets of `pack_bytes` (or the default),
        each as the backward pass produces it (`--overlap_all_reduce`,
        the default); else one all-reduce in `pack_bytes` packs after it.
        Under `--xla` nothing overlaps: the gradients appear at once.
      cycle_ms: not the engine's buckets but Horovod's own fusion, by
        cycles of this length (`fused_by_cycles`): a plain Horovod
        script, as the published clusters ran; 0: the engine's buckets.
    """

    compression: float = 1.0
    pack_bytes: int = 0
    accumulate_steps: int = 1
    average_every: int = 1
    overlap: bool = True
    cycle_ms: float = 0.0


# The backward pass is about two thirds of a step (twice the forward).
BACKWARD_SHARE = 2 / 3

# Horovod's cycle on CPU-only machines, as `horovod_ranks.set_cycle_time`
# sets it (on GPUs Horovod's own: `registry.Transport.cycle_ms`).
HOROVOD_CPU_CYCLE_MS = 5.0
# The most one fused all-reduce of Horovod 0.28.1 holds by default
# (HOROVOD_FUSION_THRESHOLD).
HOROVOD_FUSION_BYTES = 64 * 2**20


def fused_by_cycles(gradients, backward, cycle, cluster, compression=1.0):
    """When Horovod's fused all-reduces of one backward pass are through.

    Each tensor is ready at its `Gradients.ready` share of `backward`
    seconds, and fused by `horovod_cycles` into all-reduces of `cluster`.
    """
    pending = sorted(
        (ready * backward, size)
        for size, ready in zip(gradients.sizes, gradients.ready, strict=True)
        if size is not None
    )
    return horovod_cycles(
        pending, cycle,
        lambda nbytes: all_reduce_seconds(nbytes * compression, cluster),
    )  # fmt: skip


def horovod_cycles(
    pending, cycle, seconds, busy_until=0.0, share=1.0, fusion_bytes=math.inf
):
    """When Horovod's fused all-reduces of `pending` tensors are through.

    Horovod's background thread wakes every `cycle` seconds and fuses
    every tensor (or group) that is ready into one all-reduce, of up to
    `fusion_bytes`; while one is on the link, the next ones wait and are
    fused together at the first cycle after it. So the all-reduces are
    few and large where the link or each call's round trips are the
    bottleneck, and small and many where they are not.

    Args:
      pending: `[(seconds when ready, bytes), ...]`, sorted.
      cycle: Horovod's cycle, seconds.
      seconds: `bytes -> seconds` of one all-reduce alone.
      busy_until: until then the all-reduces run at `share` of their speed
        (a node whose one core also computes the backward pass; a GPU's
        CPU does not, and keeps 1).
      share: as above.
      fusion_bytes: HOROVOD_FUSION_THRESHOLD.
    """
    done, index = 0.0, 0
    while index < len(pending):
        first = pending[index][0]
        start = max(done, math.ceil(first / cycle) * cycle)
        nbytes = 0
        while (
            index < len(pending)
            and pending[index][0] <= start
            and (not nbytes or nbytes + pending[index][1] <= fusion_bytes)
        ):
            nbytes += pending[index][1]
            index += 1
        alone = seconds(nbytes)
        slowed = max(0.0, busy_until - start)  # Its time at `share`.
        if alone <= share * slowed:
            done = start + alone / share
        else:
            done = start + slowed + alone - share * slowed
    return done


class AllReduceEveryStep:
    """Synchronous SGD: the gradients all-reduced once per update."""

    summary = "the gradients, all-reduced once per update"
    synchronous = True

    def exposed_seconds(self, gradients, compute, cluster, knobs):
        """Communication per update that the computation does not hide.

        Overlapped, the buckets go one at a time, each once its gradients
        exist (`Gradients.ready` of the backward pass, which is the last
        `BACKWARD_SHARE` of the step; with accumulation, of its last
        micro-batch) and the bucket before it is through; what is left
        when the backward pass ends is exposed.

        Args:
          gradients: the model's `Gradients`.
          compute: one micro-batch's step without communication, seconds.
          cluster: a `Cluster`.
          knobs: `Knobs`.
        """
        if not knobs.overlap:
            packs = (
                len(gradients.buckets(knobs.pack_bytes))
                if knobs.pack_bytes
                else 1
            )
            nbytes = gradients.nbytes * knobs.compression
            return all_reduce_seconds(nbytes, cluster, packs)
        backward = BACKWARD_SHARE * compute
        if knobs.cycle_ms:
            done = fused_by_cycles(
                gradients, backward, knobs.cycle_ms / 1e3, cluster,
                knobs.compression,
            )  # fmt: skip
            return max(0.0, done - backward)
        done = 0.0
        for nbytes, ready in gradients.buckets(bucket_bytes(knobs.pack_bytes)):
            start = max(done, ready * backward)
            done = start + all_reduce_seconds(
                nbytes * knobs.compression, cluster
            )
        return max(0.0, done - backward)


class AllReduceEvery:
    """Local SGD: weights and momentum all-reduced every `average_every`."""

    summary = "weights and momentum, all-reduced every k updates"
    synchronous = False

    def exposed_seconds(self, gradients, compute, cluster, knobs):
        del compute
        state_bytes = 2 * gradients.nbytes  # Weights and momentum slots.
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

    def exposed_seconds(self, gradients, compute, cluster, knobs):
        del compute, knobs
        ps_tasks = cluster.ps_tasks or cluster.nodes
        sharing = max(cluster.per_node, cluster.gpus / ps_tasks)
        return 2 * sharing * gradients.nbytes / cluster.network.bandwidth


ALL_REDUCE_EVERY_STEP = AllReduceEveryStep()
ALL_REDUCE_EVERY = AllReduceEvery()
PUSH_PULL = PushPull()
