"""How far each engine scales: the ring all-reduce model, fitted and projected.

  python -m tf_resnet.scaling --model=resnet50 --gpus=64 --network=25gbe

prints the scaling efficiency to expect of every engine (and its knobs)
for that model, cluster size and network, each with a band, the engine
and knobs to pick, and the assumptions behind the figures.

The model. A synchronous engine's step on `p` GPUs is one GPU's step,
plus the part of the gradient all-reduce that nothing hides, plus the
wait for the slowest of the `p` GPUs. One all-reduce of `n` bytes over
links of bandwidth `B` and per-message latency `a` (a ring: a
reduce-scatter and an all-gather, each of `p-1` rounds) takes

    c + 2(p-1) a + 2(p-1)/p * n / B.

`horovod` and `multi_worker` all-reduce the gradients in buckets, each as
soon as the backward pass has produced it (`--overlap_all_reduce`, the
default): the schedule of `traffic.AllReduceEveryStep` starts each
bucket's ring once its gradients exist (`gradients_of` counts when, per
model) and the link has carried the bucket before it, and what is still
on the link when the backward pass ends is exposed. With
`--nooverlap_all_reduce`, and under `--xla` (whose gradients appear at
once), all of it is. `averaging` all-reduces the weights and momentum
every k steps; `parameter_server` pulls the weights and pushes the
gradients at every step, and its ps link carries every worker's traffic.
Scaling efficiency is `T(1) / T(p)`: the throughput of p GPUs against p
times one GPU's.

What the links achieve (`B` as a share of the line rate), the cost `c`
of a call, and how far a step waits for the slowest GPU are calibrated on
published GPU clusters (`tf_resnet.calibration`), not on this project's
emulated links: every figure printed carries the band that predicting
each published cluster from the others left. What a GPU computes in a
step is named in `GPU_STEPS`, the networks in `calibration.NETWORKS`:
each with its source. `bench/network_scaling.py` measures the same model
on emulated links (`RingFit`, `predict_two_nodes`).
"""

import argparse
import dataclasses
import math
import sys

import numpy as np

from tf_resnet import calibration, native_log, traffic
from tf_resnet.calibration import NETWORKS, NODES
from tf_resnet.engines import registry

IMAGENET_MODELS = ("resnet18", "resnet34", "resnet50", "resnet101", "resnet152")


@dataclasses.dataclass(frozen=True)
class GpuStep:
    """One GPU's training step of a model, without communication.

    Attributes:
      ms: the step, milliseconds (without XLA).
      xla_ms: the step under XLA, milliseconds.
      batch: images per GPU in it.
      gflops: forward GFLOPs of one image (for the derived rows).
      source: where the figures come from.
    """

    ms: float
    xla_ms: float
    batch: int
    gflops: float
    source: str

    def seconds(self, xla=False):
        return (self.xla_ms if xla else self.ms) / 1e3


_RESNET50 = GpuStep(
    1e3 * 256 / 2375 * 19.5 / 18, 1e3 * 256 / 2375, 256, 4.11,
    "NVIDIA's TensorFlow ResNet-50 v1.5 README, A100, mixed precision, "
    "batch 256: 2,375 images/s with XLA; without it, that step times the "
    "README's training times without and with XLA (19.5 and 18 hours)",
)  # fmt: skip


def _by_flops(gflops, batch):
    """A step derived from ResNet-50's by FLOPs.

    A lower bound for small models, which fill a GPU less well: their real
    step is longer, so their efficiency is higher than projected.
    """
    scale = (gflops * batch) / (_RESNET50.gflops * _RESNET50.batch)
    return GpuStep(
        _RESNET50.ms * scale, _RESNET50.xla_ms * scale, batch, gflops,
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


def given_step(model_step, images_per_s=None, batch=None):
    """`model_step` at a throughput and batch of the user's own.

    A measured throughput sets both steps (with and without XLA) alike.
    """
    if not images_per_s and not batch:
        return model_step
    batch = batch or model_step.batch
    if images_per_s:
        ms = 1e3 * batch / images_per_s
        source = f"given: {images_per_s:g} images/s at batch {batch}"
        return GpuStep(ms, ms, batch, model_step.gflops, source)
    scale = batch / model_step.batch
    return GpuStep(
        model_step.ms * scale, model_step.xla_ms * scale, batch,
        model_step.gflops,
        f"{model_step.source}, scaled to batch {batch}",
    )  # fmt: skip


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
    each whose links are the fit's, each call costing its constant
    (parameter_server: one ps task, on a node of its own); Horovod fuses
    what is ready by its cycles, as on a GPU cluster (`Transport`).

    Args:
      engine: the run's `registry.Engine`.
      knobs: its `traffic.Knobs`.
      one_node: its 1-node step, seconds (parameter_server: the step
        without any network).
      fit: the `RingFit` of its transport.
      gradients: the model's `traffic.Gradients`.

    Returns:
      Seconds per step (per update for parameter_server: two workers'
      updates interleave).
    """
    link = traffic.Link(fit.bandwidth, max(0.0, fit.a))
    ps_tasks = 1 if engine.traffic is traffic.PUSH_PULL else None
    cluster = traffic.Cluster(
        2, 1, link, link, ps_tasks=ps_tasks, call_seconds=max(0.0, fit.c)
    )
    if knobs.overlap and not knobs.cycle_ms:
        knobs = dataclasses.replace(knobs, cycle_ms=engine.transport.cycle_ms)
    step = one_node + engine.traffic.exposed_seconds(
        gradients, one_node, cluster, knobs
    )
    return step / 2 if engine.traffic is traffic.PUSH_PULL else step


# --- the projection ------------------------------------------------------


def gradients_of(model, image_size=None):
    """The `traffic.Gradients` of a model: its sizes and when each appears.

    Built once, without data: ImageNet models with ImageNet's 1000 classes
    (at 224x224, Inception V3 at 299x299, unless `image_size`), CIFAR
    models with 10 classes at 32x32. One forward pass of one image records
    each layer's output, and a layer's backward work is taken as its
    forward work: the multiply-adds of its weights at each output position
    (a convolution's kernel at each pixel of its output, a dense layer's
    once). A variable's gradient
    exists once the backward pass has done its layer and every layer after
    it, in the order the forward pass called them.
    """
    from tf_resnet import models

    application, native = _KERAS_APPLICATIONS.get(model, (None, 224))
    imagenet = model in IMAGENET_MODELS or application
    size = image_size or (native if imagenet else 32)
    shape, classes = (size, size, 3), 1000 if imagenet else 10
    if application:  # Keras' own, for their gradients only.
        import keras

        built = getattr(keras.applications, application)(
            weights=None, input_shape=shape, classes=classes
        )
    else:
        built = models.build_model(model, classes, shape)
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


# The models that `GPU_STEPS` and the published clusters
# (`calibration.ANCHORS`) need and the project does not train: their Keras
# application (ResNet v1's layers for ResNets) and its image size.
_KERAS_APPLICATIONS = {
    "resnet101": ("ResNet101", 224),
    "resnet152": ("ResNet152", 224),
    "inception_v3": ("InceptionV3", 299),
    "vgg16": ("VGG16", 224),
}


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
      engine: the `registry.Engine`.
      knobs: `traffic.Knobs`.
      compute: GPU seconds of one update's computation.
      exposed: seconds of communication per update nothing hides.
      waiting: seconds per update spent waiting for the slowest GPU.
    """

    engine: object
    knobs: traffic.Knobs
    compute: float
    exposed: float
    waiting: float = 0.0

    @property
    def efficiency(self):
        return self.compute / (self.compute + self.exposed + self.waiting)

    @property
    def band(self):
        """`(low, high)`: the published clusters' residuals around it."""
        return calibration.band(self.efficiency)

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

    def figure(self):
        """`88% (78-93%)`: the efficiency and its band."""
        low, high = self.band
        return (
            f"{100 * self.efficiency:.0f}% ({100 * low:.0f}-{100 * high:.0f}%)"
        )


DEFAULT_NODE = NODES["nvswitch-a100"]


def project(model_step, gradients, gpus, gpus_per_node, network, engine,
            knobs=None, node=DEFAULT_NODE, xla=False,
            fitted=calibration.CALIBRATION):  # fmt: skip
    """The `Projection` of `engine` (an `registry.Engine`) on a cluster.

    Args:
      model_step: the model's `GpuStep`.
      gradients: its `traffic.Gradients` (`gradients_of`).
      gpus: GPUs in all, one process each.
      gpus_per_node: GPUs sharing a node and its link.
      network: the node links' `calibration.Network`.
      engine: the `registry.Engine`.
      knobs: `traffic.Knobs` (default: none, the all-reduce overlapped).
      node: the links inside a node (`calibration.Network`).
      xla: the step under XLA, whose gradients appear at once: nothing
        of the project's all-reduce overlaps it.
      fitted: the `calibration.Calibration`.
    """
    knobs = knobs or traffic.Knobs()
    transport = engine.transport
    knobs = dataclasses.replace(
        knobs,
        overlap=knobs.overlap and not xla,
        cycle_ms=knobs.cycle_ms or transport.cycle_ms,
    )
    compute = model_step.seconds(xla)
    scaled = dataclasses.replace(
        fitted,
        tcp=fitted.tcp * transport.share,
        rdma=fitted.rdma * transport.share,
    )
    cluster = scaled.cluster(gpus, gpus_per_node, network, node)
    exposed = engine.traffic.exposed_seconds(gradients, compute, cluster, knobs)
    return Projection(
        engine, knobs, compute * knobs.accumulate_steps, exposed,
        _waiting(engine, knobs, compute, gpus, fitted),
    )  # fmt: skip


def _waiting(engine, knobs, compute, gpus, fitted):
    """Seconds per update spent waiting for the slowest GPU.

    A synchronous update waits once for the slowest of its micro-batches'
    sums (their spread grows as the square root of their count); averaging
    waits once every k steps; asynchronous workers do not wait.
    """
    if engine.traffic is traffic.PUSH_PULL:
        return 0.0
    steps = knobs.accumulate_steps * knobs.average_every
    return (
        fitted.straggling(compute, gpus)
        * math.sqrt(steps)
        / (knobs.average_every)
    )


def candidates(average_every=(4, 16), accumulate=(2, 4)):
    """`(Engine, Knobs)` of every row a projection shows.

    The engines that send something between nodes, in the registry's
    order for them (`registry.across_nodes`): those whose all-reduce
    overlaps the backward pass (the default), also without it (the
    control), compressed and accumulating; those that take local steps,
    at each of `average_every`; the others, as they are.
    """
    rows = []
    for engine in registry.across_nodes():
        if engine.overlaps:
            rows.append((engine, traffic.Knobs()))
            rows.append((engine, traffic.Knobs(overlap=False)))
            rows.append((engine, traffic.Knobs(compression=0.5)))
            rows += [
                (engine, traffic.Knobs(compression=0.5, accumulate_steps=k))
                for k in accumulate
            ]
        elif engine.update is registry.Update.PROCESS:
            rows += [
                (engine, traffic.Knobs(average_every=k)) for k in average_every
            ]
        else:
            rows.append((engine, traffic.Knobs()))
    return rows


def projections(model_step, gradients, gpus, gpus_per_node, network,
                node=DEFAULT_NODE, xla=False):  # fmt: skip
    """Every candidate's `Projection`."""
    return [
        project(model_step, gradients, gpus, gpus_per_node, network,
                engine, knobs, node, xla)
        for engine, knobs in candidates()
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


# --- the published clusters ---------------------------------------------


def anchor_gradients(anchors=calibration.ANCHORS):
    """`{model: traffic.Gradients}` of every anchor's model."""
    return {model: gradients_of(model) for model in {a.model for a in anchors}}


def format_anchors(gradients=None):
    """Each published figure beside the model's, fitted without it."""
    gradients = gradients or anchor_gradients()
    fitted = calibration.fit(gradients)
    lines = [
        "| published cluster | GPUs | published | model | fitted without "
        "it | error, points | notes |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    notes, errors = [], []
    for anchor, left_out, _ in calibration.leave_one_out(gradients):
        model = calibration.anchor_efficiency(
            anchor, gradients[anchor.model], fitted
        )
        errors.append(100 * (left_out - anchor.published))
        note = f"{anchor.source}" + (
            f"; assumed: {anchor.assumed}" if anchor.assumed else ""
        )
        if note not in notes:
            notes.append(note)
        lines.append(
            f"| {anchor.label} | {anchor.gpus} | "
            f"{100 * anchor.published:.1f}% | {100 * model:.1f}% | "
            f"{100 * left_out:.1f}% | {errors[-1]:+.1f} | "
            f"[{notes.index(note) + 1}] |"
        )
    within = sum(abs(e) <= 5 for e in errors)
    lines += [
        "",
        *(f"[{i}] {note}" for i, note in enumerate(notes, 1)),
        "",
        f"fitted to all {len(errors)}: {_describe(fitted)}; stored "
        f"(tf_resnet.calibration.CALIBRATION): "
        f"{_describe(calibration.CALIBRATION)}",
        f"fitted without it: {within} of {len(errors)} within 5 points; "
        f"errors from {min(errors):+.1f} to {max(errors):+.1f} points "
        f"(the stored band, published less fitted: "
        f"{calibration.RESIDUALS[0]:+.1f} to "
        f"{calibration.RESIDUALS[1]:+.1f}), root mean square "
        f"{float(np.sqrt(np.mean(np.square(errors)))):.1f}",
    ]
    return "\n".join(lines)


def _describe(fitted):
    return (
        f"TCP links at {100 * fitted.tcp:.1f}% of their rate, RDMA at "
        f"{100 * fitted.rdma:.1f}%, {fitted.call_ms:g} ms a call, a step "
        f"spread of {100 * fitted.straggle:.1f}%"
    )


# --- the command ------------------------------------------------------------


def main(argv=None):
    """`python -m tf_resnet.scaling`: prints a projection."""
    parser = argparse.ArgumentParser(
        prog="python -m tf_resnet.scaling",
        description="Projected scaling efficiency of each engine and knob, "
        "with the band the published clusters' residuals give.",
    )
    parser.add_argument(
        "--model", default="resnet50", choices=sorted(GPU_STEPS)
    )
    parser.add_argument("--gpus", type=int, default=64)
    parser.add_argument("--gpus_per_node", type=int, default=8)
    parser.add_argument("--network", default="25gbe", choices=sorted(NETWORKS))
    parser.add_argument(
        "--node", default=DEFAULT_NODE.name, choices=sorted(NODES),
        help="the links inside a node",
    )  # fmt: skip
    parser.add_argument(
        "--images_per_s", type=float,
        help="one GPU's measured training throughput (instead of the "
        "model's published A100 step)",
    )  # fmt: skip
    parser.add_argument("--batch", type=int, help="images per GPU")
    parser.add_argument(
        "--xla", action="store_true",
        help="the step under XLA: faster, but nothing of the all-reduce "
        "overlaps it",
    )  # fmt: skip
    parser.add_argument(
        "--table",
        action="store_true",
        help="every network at 8, 64 and 512 GPUs, one line each (Markdown)",
    )
    parser.add_argument(
        "--anchors",
        action="store_true",
        help="each published cluster beside the model's figure for it, "
        "fitted with and without it (Markdown)",
    )
    args = parser.parse_args(argv)
    if args.gpus < 1 or args.gpus_per_node < 1:
        parser.error("--gpus and --gpus_per_node must be at least 1")
    if (args.images_per_s or 1) <= 0 or (args.batch or 1) < 1:
        parser.error("--images_per_s and --batch must be positive")
    native_log.filter_stderr()  # TensorFlow's import notices (absl's).
    if args.anchors:
        print(format_anchors())
        return
    step = given_step(GPU_STEPS[args.model], args.images_per_s, args.batch)
    gradients = gradients_of(args.model)
    node = NODES[args.node]
    if args.table:
        print(format_table(step, gradients, args.gpus_per_node, node, args.xla))
        return
    network = NETWORKS[args.network]
    rows = projections(
        step, gradients, args.gpus, args.gpus_per_node, network, node, args.xla
    )
    print(format_projection(args, network, step, gradients, rows))


def format_table(step, gradients, gpus_per_node, node=DEFAULT_NODE,
                 xla=False, sizes=(8, 64, 512)):  # fmt: skip
    """Markdown: per network and size, Horovod either way and what to use."""
    lines = [
        "| network | GPUs | horovod, one all-reduce after the backward pass "
        "| horovod (overlapped) | use (same batch) | with accumulation "
        "(global batch) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for network in NETWORKS.values():
        for gpus in sizes:
            rows = projections(
                step, gradients, gpus, gpus_per_node, network, node, xla
            )
            best = pick(rows)
            larger = pick(rows, accumulate=True)
            batch = gpus * step.batch * larger.knobs.accumulate_steps
            lines.append(
                f"| {network.name} | {gpus} | {rows[1].figure()} "
                f"| {rows[0].figure()} "
                f"| {best.describe()}: {best.figure()} | "
                f"{larger.describe()}: {larger.figure()} ({batch:,}) |"
            )
    return "\n".join(lines)


def format_projection(args, network, step, gradients, rows):
    """The command's report: the cluster, every row, what to use, why."""
    nodes = max(1, -(-args.gpus // args.gpus_per_node))
    node = NODES[args.node]
    low, high = calibration.RESIDUALS
    lines = [
        f"{args.model}: {gradients.nbytes / 1e6:.1f} MB of float32 "
        f"gradients; one GPU step {1e3 * step.seconds(args.xla):.1f} ms at "
        f"batch {step.batch}{' under XLA' if args.xla else ''} "
        f"({step.source})",
        f"{args.gpus} GPUs in {nodes} node(s) of {args.gpus_per_node}, one "
        f"{network.label} link each ({network.gbit:g} Gbit/s, "
        f"{network.latency_us:g} us: {network.source}); inside a node "
        f"{node.label}",
        "",
        f"{'engine and knobs':52} {'exposed ms':>10} {'waiting ms':>10} "
        f"{'efficiency (band)':>18}",
    ]
    for row in rows:
        lines.append(
            f"{row.describe():52} {1e3 * row.exposed:10.1f} "
            f"{1e3 * row.waiting:10.1f} {row.figure():>18}"
        )
    best = pick(rows)
    larger = pick(rows, accumulate=True)
    batch = args.gpus * step.batch * larger.knobs.accumulate_steps
    lines += [
        "",
        f"use: {best.describe()} ({best.figure()})",
        f"with a larger batch: {larger.describe()} "
        f"({larger.figure()}, a global batch of {batch:,}: beyond about 8k "
        "images ResNet-50's SGD recipe needs more than linear learning-rate "
        "scaling and warm-up, Goyal et al. 2017)",
        "",
        "efficiency: one update's computation over it plus the communication "
        "nothing hides plus the wait for the slowest GPU (synchronous rows: "
        "buckets all-reduced one at a time as the backward pass produces "
        "them, the last two thirds of the step, unless one all-reduce after "
        "the backward pass, as always under --xla). Link shares, the cost of "
        "a call and the step spread are calibrated on published GPU "
        "clusters (python -m tf_resnet.scaling --anchors); the band is the "
        f"range, {low:+.1f} to {high:+.1f} points, by which a fit to all "
        "but one of them missed the one left out. fp16 halves the bytes on "
        "NCCL (the horovod#779 anchors need it); on Gloo, a CPU's, the "
        "bench measured 1.10-1.17x, so it is not projected there. "
        "Accumulate k computes k micro-batches per all-reduce (a k times "
        "larger batch); averaging and parameter_server are not synchronous "
        "SGD (their accuracy per step differs).",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
