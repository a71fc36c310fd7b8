"""How far each engine scales: the ring all-reduce model, fitted and projected.

  python -m tf_resnet.scaling --model=resnet50 --gpus=64 --network=25gbe

prints the expected scaling efficiency of every engine (and its knobs) for
that model, cluster size and network, the engine and knobs to pick, and
the assumptions behind the figures.

The model. A synchronous engine's step on `p` processes is its one-process
step plus the part of the gradient all-reduce that nothing hides. One
all-reduce of `n` bytes over links of bandwidth `B` and per-message
latency `a` (a ring: a reduce-scatter and an all-gather, each of `p-1`
rounds) takes

    ring(n, p) = 2(p-1) a + 2(p-1)/p * n / B.

`horovod` and `multi_worker` all-reduce the gradients in buckets, each as
soon as the backward pass has produced it (`--overlap_all_reduce`, the
default): the schedule of `traffic.AllReduceEveryStep` starts each
bucket's ring once its gradients exist (`gradients_of` counts when, per
model) and the link has carried the bucket before it, and what is still
on the link when the backward pass ends is exposed. With
`--nooverlap_all_reduce` all of `ring(n, p)` is. `averaging` all-reduces
the weights and momentum every k steps; `parameter_server` pulls the
weights and pushes the gradients at every step, and its ps link carries
every worker's traffic. Scaling efficiency is `T(1) / T(p)`: the
throughput of p GPUs against p times one GPU's.

Measured and fitted on emulated networks by `bench/network_scaling.py`
(bench/results/network_scaling.md): the fitted bandwidth efficiency of each
transport (`TRANSPORTS`) is what carries over to the projection; the
latency is the network's. What a GPU computes in a step is named in
`GPU_STEPS`, the networks in `NETWORKS`: each with its source.
"""

import argparse
import dataclasses
import math
import sys

import numpy as np

from tf_resnet import native_log, traffic

IMAGENET_MODELS = ("resnet18", "resnet34", "resnet50", "resnet101", "resnet152")


@dataclasses.dataclass(frozen=True)
class Network:
    """A cluster network, as one GPU's (or one node's) link sees it.

    Attributes:
      name: the `--network` value.
      label: what it is.
      gbit: line rate, Gbit/s.
      latency_us: one message's latency, microseconds.
      source: where the figures come from.
    """

    name: str
    label: str
    gbit: float
    latency_us: float
    source: str

    @property
    def bytes_per_s(self):
        return self.gbit * 1e9 / 8


NETWORKS = {
    n.name: n
    for n in (
        Network(
            "10gbe", "10 Gb Ethernet, TCP", 10, 25,
            "line rate; latency of a kernel TCP round over a switch (typical "
            "10 GbE figures, 20-50 us)",
        ),
        Network(
            "25gbe", "25 Gb Ethernet, RoCE (Horovod's benchmark cluster)", 25,
            5, "line rate; RDMA over Converged Ethernet latency (a few us)",
        ),
        Network(
            "100ib", "100 Gb InfiniBand (EDR)", 100, 1.5,
            "line rate; EDR InfiniBand's verbs latency (about 1-2 us)",
        ),
    )
}  # fmt: skip
# Inside one 8-GPU node (A100 SXM, NVLink 3: 300 GB/s each way).
NVLINK = Network("nvlink", "NVLink 3 inside a node", 2400, 3, "A100 data sheet")


@dataclasses.dataclass(frozen=True)
class GpuStep:
    """One GPU's training step of a model, without communication.

    Attributes:
      ms: the step, milliseconds.
      batch: images per GPU in it.
      gflops: forward GFLOPs of one image (for the derived rows).
      source: where `ms` comes from.
    """

    ms: float
    batch: int
    gflops: float
    source: str


_RESNET50 = GpuStep(
    108.0, 256, 4.11,
    "NVIDIA's TensorFlow ResNet-50 v1.5 benchmark, A100, mixed precision, "
    "batch 256 (about 2,370 images/s)",
)  # fmt: skip


def _by_flops(gflops, batch):
    """A step derived from ResNet-50's by FLOPs.

    A lower bound for small models, which fill a GPU less well: their real
    step is longer, so their efficiency is higher than projected.
    """
    ms = _RESNET50.ms * (gflops * batch) / (_RESNET50.gflops * _RESNET50.batch)
    return GpuStep(
        ms, batch, gflops,
        f"derived: ResNet-50's step scaled by FLOPs ({gflops} GFLOPs/image "
        f"at batch {batch}); a lower bound",
    )  # fmt: skip


GPU_STEPS = {
    "resnet50": _RESNET50,
    "resnet18": _by_flops(1.82, 256),
    "resnet34": _by_flops(3.67, 256),
    "resnet101": _by_flops(7.83, 256),
    "resnet152": _by_flops(11.56, 256),
    "resnet20": _by_flops(0.041, 128),
    "resnet56": _by_flops(0.126, 128),
    "resnet110": _by_flops(0.253, 128),
}


# --- the cost model --------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RingFit:
    """`c + 2(p-1) a + 2(p-1)/p * n / B`, fitted to measured all-reduces.

    Attributes:
      c: a constant per call (a Horovod cycle, a function call), seconds.
      a: latency per ring round, seconds.
      bandwidth: B, bytes/second.
    """

    c: float
    a: float
    bandwidth: float

    def ring(self, nbytes, processes):
        """What `processes` add to one all-reduce over one process."""
        p = processes
        if p <= 1:
            return 0.0
        return 2 * (p - 1) * self.a + 2 * (p - 1) / p * nbytes / self.bandwidth

    def __call__(self, nbytes, processes):
        return self.c + self.ring(nbytes, processes)


def fit_ring(samples):
    """Least-squares `RingFit` to `[(nbytes, processes, seconds), ...]`.

    Relative errors are minimised (each row divided by its time), so the
    small messages that set `c` and `a` count as much as the large ones.
    """
    rows = np.array(
        [[1.0, 2 * (p - 1), 2 * (p - 1) / p * n] for n, p, _ in samples]
    )
    seconds = np.array([s for _, _, s in samples])
    weights = 1 / seconds
    (c, a, g), *_ = np.linalg.lstsq(
        rows * weights[:, None], seconds * weights, rcond=None
    )
    return RingFit(float(c), float(a), float(1 / g) if g > 0 else math.inf)


def predict_two_nodes(engine, knobs, one_node, fit, gradients):
    """The 2-node step of a run from its 1-node step and a fit.

    The same `Engine.traffic` that projects, on two nodes of one process
    each whose links are the fit's (parameter_server: one ps task, on a
    node of its own).

    Args:
      engine: the run's `engines.Engine`.
      knobs: its `traffic.Knobs`.
      one_node: its 1-node step, seconds (parameter_server: the step
        without any network).
      fit: the `RingFit` of its transport.
      gradients: the model's `traffic.Gradients`.

    Returns:
      Seconds per step (per update for parameter_server: two workers'
      updates interleave).
    """
    link = traffic.Link(fit.bandwidth, fit.a)
    ps_tasks = 1 if engine.traffic is traffic.PUSH_PULL else None
    cluster = traffic.Cluster(2, 1, link, link, ps_tasks=ps_tasks)
    step = one_node + engine.traffic.exposed_seconds(
        gradients, one_node, cluster, knobs
    )
    return step / 2 if engine.traffic is traffic.PUSH_PULL else step


# --- the projection ------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Transport:
    """How well an engine's transport uses a link, as measured here.

    Attributes:
      efficiency: achieved bandwidth over the link's rate (the fitted B of
        `bench/network_scaling.py` over the shaped rate).
      measured: where it was measured.
    """

    efficiency: float
    measured: str


_MEASURED = (
    "bench/results/network_scaling.md: ResNet-18 on emulated 10 GbE, the "
    "mean of two runs' fits"
)
# The bandwidth efficiency of each engine's transport on the emulated
# links (fitted B over the shaped rate; parameter_server: one worker's
# pull and push). The projection carries them over to the GPU cluster's
# links: an assumption, since NCCL over RDMA is another transport.
TRANSPORTS = {
    "horovod": Transport(0.95, _MEASURED),
    "multi_worker": Transport(0.78, _MEASURED),
    "averaging": Transport(0.95, _MEASURED + " (Horovod's all-reduce)"),
    "parameter_server": Transport(
        0.66,
        "bench/results/network_scaling.md: ResNet-20 on emulated 10 GbE, "
        "one worker's pull and push (its 1-node step less the same job's "
        "on unshaped links), the median of three rounds",
    ),
}


def gradients_of(model, image_size=None):
    """The `traffic.Gradients` of a model: its sizes and when each appears.

    Built once, without data: ImageNet models with ImageNet's 1000 classes
    (at 224x224 unless `image_size`), CIFAR models with 10 classes at
    32x32. One forward pass of one image records each layer's output, and
    a layer's backward work is taken as its forward work: the multiply-adds
    of its weights at each output position (a convolution's kernel at each
    pixel of its output, a dense layer's once). A variable's gradient
    exists once the backward pass has done its layer and every layer after
    it, in the order the forward pass called them.
    """
    from tf_resnet import models

    imagenet = model in IMAGENET_MODELS
    size = image_size or (224 if imagenet else 32)
    shape, classes = (size, size, 3), 1000 if imagenet else 10
    if model in models.MODELS:
        built = models.build_model(model, classes, shape)
    else:  # ResNet-101 and -152: Keras' own, for their gradients only.
        import keras

        application = _KERAS_RESNETS[model]
        built = getattr(keras.applications, application)(
            weights=None, input_shape=shape, classes=classes
        )
    called = []  # (layer, output shape), in the forward pass's order.
    for layer in built._flatten_layers(include_self=False):
        if layer.trainable_weights and not list(
            layer._flatten_layers(include_self=False)
        ):
            layer.call = _recording(layer, layer.call, called)
    built(np.zeros((1, size, size, 3), "float32"), training=False)
    work = []
    for layer, shape in called:
        positions = math.prod(shape[1:-1])
        weights = sum(math.prod(w.shape) for w in layer.trainable_weights)
        work.append((layer, positions * weights))
    total = sum(w for _, w in work)
    ready, after = {}, 0
    for layer, amount in reversed(work):
        after += amount
        for weight in layer.trainable_weights:
            ready.setdefault(id(weight), after / total)
    variables = built.trainable_variables
    return traffic.Gradients(
        tuple(4 * math.prod(v.shape) for v in variables),
        tuple(ready.get(id(v), 1.0) for v in variables),
    )


# The models `GPU_STEPS` projects that the project does not train: their
# Keras application, which has the same layers (ResNet v1).
_KERAS_RESNETS = {"resnet101": "ResNet101", "resnet152": "ResNet152"}


def _recording(layer, call, called):
    """`call` that notes `(layer, output shape)` in `called` first time."""

    def recorded(*args, **kwargs):
        outputs = call(*args, **kwargs)
        if not any(seen is layer for seen, _ in called):
            called.append((layer, tuple(outputs.shape)))
        return outputs

    return recorded


def gradient_bytes(model):
    """float32 bytes of a model's trainable variables."""
    return gradients_of(model).nbytes


@dataclasses.dataclass(frozen=True)
class Projection:
    """One engine with its knobs on one cluster.

    Attributes:
      engine: the `engines.Engine`.
      knobs: `traffic.Knobs`.
      compute: GPU seconds of one update's computation.
      exposed: seconds of communication per update nothing hides.
    """

    engine: object
    knobs: traffic.Knobs
    compute: float
    exposed: float

    @property
    def efficiency(self):
        return self.compute / (self.compute + self.exposed)

    def describe(self):
        parts = [self.engine.name]
        if self.engine.traffic is traffic.ALL_REDUCE_EVERY:
            parts[0] += f" every {self.knobs.average_every}"
        if self.engine.overlaps and not self.knobs.overlap:
            parts.append("one all-reduce after the backward pass")
        if self.knobs.compression < 1:
            parts.append("fp16")
        if self.knobs.accumulate_steps > 1:
            parts.append(f"accumulate {self.knobs.accumulate_steps}")
        return ", ".join(parts)


def cluster_of(gpus, gpus_per_node, network, efficiency, node=NVLINK):
    """The `traffic.Cluster`, links at `efficiency` of their rate."""
    return traffic.Cluster(
        gpus,
        gpus_per_node,
        traffic.Link(
            network.bytes_per_s * efficiency, network.latency_us / 1e6
        ),
        traffic.Link(node.bytes_per_s * efficiency, node.latency_us / 1e6),
    )


def project(model_step, gradients, gpus, gpus_per_node, network, engine,
            knobs=None, node=NVLINK):  # fmt: skip
    """The `Projection` of `engine` (an `engines.Engine`) on a cluster.

    Args:
      model_step: the model's `GpuStep`.
      gradients: its `traffic.Gradients` (`gradients_of`).
      gpus: GPUs in all, one process each.
      gpus_per_node: GPUs sharing a node and its link.
      network: the node links' `Network`.
      engine: the `engines.Engine`.
      knobs: `traffic.Knobs` (default: none, the all-reduce overlapped).
      node: the links inside a node (`Network`).
    """
    knobs = knobs or traffic.Knobs()
    compute = model_step.ms / 1e3
    cluster = cluster_of(
        gpus, gpus_per_node, network, TRANSPORTS[engine.name].efficiency, node
    )
    exposed = engine.traffic.exposed_seconds(gradients, compute, cluster, knobs)
    return Projection(engine, knobs, compute * knobs.accumulate_steps, exposed)


def candidates(average_every=(4, 16), accumulate=(2, 4)):
    """`(engine name, Knobs)` of every row a projection shows.

    The engines that send something between nodes (`Engine.traffic`), as
    the registry tells: first those whose all-reduce overlaps the backward
    pass (the default), also without it (the control), compressed and
    accumulating; then those that take local steps, at each of
    `average_every`; then the others, as they are.
    """
    from tf_resnet.config import engines

    across_nodes = [e for e in engines.ENGINES.values() if e.traffic]
    rows = []
    for engine in across_nodes:
        if not engine.overlaps:
            continue
        rows.append((engine.name, traffic.Knobs()))
        rows.append((engine.name, traffic.Knobs(overlap=False)))
        rows.append((engine.name, traffic.Knobs(compression=0.5)))
        rows += [
            (engine.name, traffic.Knobs(compression=0.5, accumulate_steps=k))
            for k in accumulate
        ]
    local_steps = [
        e for e in across_nodes if e.update is engines.Update.PROCESS
    ]
    for engine in local_steps:
        rows += [
            (engine.name, traffic.Knobs(average_every=k)) for k in average_every
        ]
    rows += [
        (engine.name, traffic.Knobs())
        for engine in across_nodes
        if not engine.overlaps and engine not in local_steps
    ]
    return rows


def projections(model_step, gradients, gpus, gpus_per_node, network):
    """Every candidate's `Projection`."""
    from tf_resnet.config import engines

    return [
        project(model_step, gradients, gpus, gpus_per_node, network,
                engines.ENGINES[name], knobs)
        for name, knobs in candidates()
    ]  # fmt: skip


def pick(rows, target=0.9, accumulate=False):
    """The engine and knobs to use.

    The first synchronous row, in the order of `candidates` (fewer knobs
    first), that reaches `target`; else the most efficient one. With
    `accumulate` only the rows that accumulate (a larger batch: the
    model's recipe must allow it), without it only those that do not.
    """
    synchronous = [
        r
        for r in rows
        if r.engine.traffic.synchronous
        and (r.knobs.accumulate_steps > 1) == accumulate
    ]
    for row in synchronous:
        if row.efficiency >= target:
            return row
    return max(synchronous, key=lambda r: r.efficiency)


# Published figures of other people's clusters, each beside the model's
# projection of that same setting (`--anchors`).
PCIE3 = Network(
    "pcie3", "PCIe 3.0 x16 inside a node", 126, 5, "PCIe 3.0 x16 line rate"
)


@dataclasses.dataclass(frozen=True)
class Anchor:
    """A published scaling efficiency and the setting it was measured in.

    Attributes:
      label: what was measured, and where it is published.
      model: the model (`GPU_STEPS`' names: its gradients).
      step: one GPU's step there (`GpuStep`).
      gpus: GPUs in all.
      gpus_per_node: GPUs of a node.
      network: its node links.
      node: the links inside its nodes.
      published: the published efficiency.
    """

    label: str
    model: str
    step: GpuStep
    gpus: int
    gpus_per_node: int
    network: Network
    node: Network
    published: float


ANCHORS = (
    Anchor(
        "Horovod's benchmark (docs/benchmarks.rst): ResNet-101, 128 servers "
        "of 4 Pascal GPUs, 25 Gbit/s RoCE",
        "resnet101",
        GpuStep(
            1e3 * 64 / (1656.82 / 16), 64, 7.83,
            "batch 64 at the 103.6 images/s per GPU of the page's own "
            "16-GPU output (1656.82 images/s): an upper bound of the "
            "computation",
        ),
        512, 4, NETWORKS["25gbe"], PCIE3, 0.90,
    ),
    Anchor(
        "a user's ResNet-50 on AWS p3.16xlarge (horovod#779): 8 V100s "
        "with NVLink a node, 25 Gbit/s TCP",
        "resnet50",
        GpuStep(
            1e3 * 256 / 872, 256, 4.11,
            "872 images/s on one V100 (horovod#779's table); batch 256 "
            "assumed (not given there; that rate is mixed precision's, "
            "whose usual batch is 256)",
        ),
        64, 8,
        Network(
            "25gbe-tcp", "25 Gb Ethernet, TCP", 25, 25,
            "line rate; a kernel TCP round's latency, as 10gbe's",
        ),
        NVLINK, 0.845,
    ),
)  # fmt: skip


def project_anchor(anchor, gradients):
    """Horovod's `Projection` in `anchor`'s setting (overlapped, as it is)."""
    from tf_resnet.config import engines

    return project(
        anchor.step, gradients, anchor.gpus, anchor.gpus_per_node,
        anchor.network, engines.ENGINES["horovod"], node=anchor.node,
    )  # fmt: skip


def format_anchors():
    """Each published figure beside the model's projection of its setting."""
    lines = [
        "| measured | GPUs | published | projected, horovod overlapped | "
        "one all-reduce after the backward pass |",
        "| --- | --- | --- | --- | --- |",
    ]
    for anchor in ANCHORS:
        gradients = gradients_of(anchor.model)
        overlapped = project_anchor(anchor, gradients)
        after = project(
            anchor.step, gradients, anchor.gpus, anchor.gpus_per_node,
            anchor.network, overlapped.engine, traffic.Knobs(overlap=False),
            anchor.node,
        )  # fmt: skip
        lines.append(
            f"| {anchor.label} (step {anchor.step.ms:.0f} ms: "
            f"{anchor.step.source}) | {anchor.gpus} | "
            f"{100 * anchor.published:.1f}% | "
            f"{100 * overlapped.efficiency:.0f}% | "
            f"{100 * after.efficiency:.0f}% |"
        )
    return "\n".join(lines)


def main(argv=None):
    """`python -m tf_resnet.scaling`: prints a projection."""
    parser = argparse.ArgumentParser(
        prog="python -m tf_resnet.scaling",
        description="Projected scaling efficiency of each engine and knob.",
    )
    parser.add_argument(
        "--model", default="resnet50", choices=sorted(GPU_STEPS)
    )
    parser.add_argument("--gpus", type=int, default=64)
    parser.add_argument("--gpus_per_node", type=int, default=8)
    parser.add_argument("--network", default="25gbe", choices=sorted(NETWORKS))
    parser.add_argument(
        "--table",
        action="store_true",
        help="every network at 8, 64 and 512 GPUs, one line each (Markdown)",
    )
    parser.add_argument(
        "--anchors",
        action="store_true",
        help="published efficiencies beside the projection of their own "
        "settings (Markdown)",
    )
    args = parser.parse_args(argv)
    if args.gpus < 1 or args.gpus_per_node < 1:
        parser.error("--gpus and --gpus_per_node must be at least 1")
    network = NETWORKS[args.network]
    step = GPU_STEPS[args.model]
    native_log.filter_stderr()  # TensorFlow's import notices (absl's).
    if args.anchors:
        print(format_anchors())
        return
    gradients = gradients_of(args.model)
    if args.table:
        print(format_table(step, gradients, args.gpus_per_node))
        return
    rows = projections(step, gradients, args.gpus, args.gpus_per_node, network)
    print(format_projection(args, network, step, gradients, rows))


def format_table(step, gradients, gpus_per_node, sizes=(8, 64, 512)):
    """Markdown: per network and size, Horovod either way and what to use."""
    lines = [
        "| network | GPUs | horovod, one all-reduce after the backward pass "
        "| horovod (overlapped) | use (same batch) | with accumulation "
        "(global batch) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for network in NETWORKS.values():
        for gpus in sizes:
            rows = projections(step, gradients, gpus, gpus_per_node, network)
            best = pick(rows)
            larger = pick(rows, accumulate=True)
            batch = gpus * step.batch * larger.knobs.accumulate_steps
            lines.append(
                f"| {network.name} | {gpus} | {100 * rows[1].efficiency:.0f}% "
                f"| {100 * rows[0].efficiency:.0f}% "
                f"| {best.describe()}: {100 * best.efficiency:.0f}% | "
                f"{larger.describe()}: {100 * larger.efficiency:.0f}% "
                f"({batch:,}) |"
            )
    return "\n".join(lines)


def format_projection(args, network, step, gradients, rows):
    """The command's report: the cluster, every row, what to use, why."""
    nodes = max(1, -(-args.gpus // args.gpus_per_node))
    lines = [
        f"{args.model}: {gradients.nbytes / 1e6:.1f} MB of float32 "
        f"gradients; one GPU step {step.ms:.1f} ms at batch {step.batch} "
        f"({step.source})",
        f"{args.gpus} GPUs in {nodes} node(s) of {args.gpus_per_node}, one "
        f"{network.label} link each ({network.gbit:g} Gbit/s, "
        f"{network.latency_us:g} us: {network.source})",
        "",
        f"{'engine and knobs':58} {'exposed ms':>10} {'efficiency':>10}",
    ]
    for row in rows:
        lines.append(
            f"{row.describe():58} {1e3 * row.exposed:10.1f} "
            f"{100 * row.efficiency:9.1f}%"
        )
    best = pick(rows)
    larger = pick(rows, accumulate=True)
    batch = args.gpus * step.batch * larger.knobs.accumulate_steps
    lines += [
        "",
        f"use: {best.describe()} ({100 * best.efficiency:.0f}%)",
        f"with a larger batch: {larger.describe()} "
        f"({100 * larger.efficiency:.0f}%, a global batch of {batch:,}: "
        "beyond about 8k images ResNet-50's SGD recipe needs more than "
        "linear learning-rate scaling and warm-up, Goyal et al. 2017)",
        "",
        "efficiency: one update's computation over it plus the communication "
        "nothing hides (synchronous rows: buckets all-reduced one at a time "
        "as the backward pass produces them, the last two thirds of the "
        "step, unless one all-reduce after the backward pass); transports "
        "at the bandwidth efficiency measured on emulated links "
        "(bench/results/network_scaling.md); fp16 halves the bytes; "
        "accumulate k computes k micro-batches per all-reduce (a k times "
        "larger batch); averaging and parameter_server are not synchronous "
        "SGD (their accuracy per step differs).",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
