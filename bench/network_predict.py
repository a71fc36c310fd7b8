"""network_scaling's predictions of each 2-node step, before its jobs.

From what is known before a round's 2-node jobs (the calibration's link,
all-reduce sweeps and a step's all-reduces timed alone, with added
latency the delayers' holding, the round's 1-node jobs, the model's
layer table), `predict_row` predicts every
row's 2-node step; `PredictionsFile` writes each round's predictions,
hashed, before the jobs they are scored against start.
"""

import dataclasses
import statistics

import scaling_score
from network_worker import model_shape

from tf_resnet import scaling, traffic
from tf_resnet.engines import registry


def knobs_of(flags, script="", bucket_bytes=None, threads=None):
    """The `traffic.Knobs` of a row's flags (and script).

    Float16's halved bytes are in its own fitted transport, not here. The
    `DistributedGradientTape` script all-reduces each tensor as it
    appears, and Horovod fuses the tensors ready in one cycle into one
    message: modelled as the engine's buckets (a bucket per tensor would
    pay each one's latency, which fusion does not). An engine whose
    overlap waits for a second inter-op thread does not overlap on
    `threads` 1: its buckets go one after another after the backward pass.
    """
    del script
    engine = registry.get(flags["distribution"])
    overlaps = flags.get("overlap_all_reduce", True)
    overlap = overlaps and not (
        engine.overlap_waits_for_a_thread and threads == 1
    )
    packs = flags.get("all_reduce_pack_bytes", 0)
    return traffic.Knobs(
        pack_bytes=packs or (bucket_bytes if overlaps else 0) or 0,
        accumulate_steps=flags.get("accumulate_steps", 1),
        average_every=flags.get("average_every", 1),
        overlap=overlap,
    )


def gradients_of(model):
    """`traffic.Gradients` of a model at the size it trains on here."""
    size, _ = model_shape(model)
    return scaling.gradients_of(model, size)


def fits_of(result):
    """`{transport: RingFit}` fitted to a model's all-reduce sweeps.

    A float16 transport's fit is in float32 bytes (what it is handed).
    """
    samples = {}
    for key, sweep in result["sweeps"].items():
        transport, processes = key.split()
        samples.setdefault(transport, []).extend(
            (int(nbytes), int(processes), seconds)
            for nbytes, seconds in sweep.items()
        )
    return {t: scaling.fit_ring(s) for t, s in samples.items()}


def transport_of(flags):
    """The fitted transport that carries a row's communication."""
    engine = registry.get(flags["distribution"]).transport.name
    fp16 = flags.get("gradient_compression") == "fp16"
    return f"{engine}+fp16" if fp16 else engine


def cpu_fits_of(result):
    """`{transport: fit}` of the chief's CPU time per all-reduce, 2 processes.

    From the sweeps (`sweep`), fitted per call and per byte
    (`scaling_score.fit_cpu`).
    """
    fits = {}
    for key, sweep_cpu in result.get("sweep_cpu_s", {}).items():
        transport, processes = key.split()
        if processes == "2":
            fits[transport] = scaling_score.fit_cpu(
                [(int(n), cpu) for n, cpu in sweep_cpu.items()]
            )
    return fits


def communication_cpu(cpu_fit, knobs, gradients):
    """CPU time per update a row's all-reduces cost a node's one core.

    Overlapped on a node of one core, the all-reduce's CPU work (Gloo's or
    gRPC's threads, the kernel's TCP) runs between the backward pass's
    ops, not beside them, so the prediction adds it to the step (a GPU
    node's CPU does it beside the GPU's computation). It is estimated
    from what is known before the row's 2-node jobs: the transport's
    CPU time per all-reduce in the sweeps (`cpu_fits_of`), for the row's
    buckets and bytes. Not from the 2-node job's own CPU time less the
    1-node job's, as the model took it before: that is a measurement of
    the job being predicted, and a prediction scored on it is a fit.
    """
    calls = len(gradients.buckets(knobs.pack_bytes)) if knobs.pack_bytes else 1
    return scaling_score.communication_cpu(cpu_fit, gradients.nbytes, calls)


def threads_of(result, row):
    """The inter-op threads of a row's processes.

    Runs saved before rows recorded them: the row's flag, else the run's.
    """
    return (
        row.get("inter_op_threads")
        or row["flags"].get("inter_op_threads")
        or result.get("inter_op_threads", 1)
    )


# The share of its speed alone an all-reduce keeps while the backward pass
# runs on the node's one core: the two take turns on it, and the Gloo and
# TCP work of the all-reduce waits for its turn. Fitted once, on the first
# predict-then-measure run's `horovod` rows at 10 GbE (bench/results/
# network_scaling.md says which, and the runs it was scored on since);
# not refitted on a run it predicts.
BUSY_CORE_SHARE = 2 / 3

# What a synchronous row may send for its step's all-reduces, as the
# calibration's sweep job sent them, to be predicted from them.
_AS_CALIBRATED = {
    "distribution", "overlap_all_reduce", "gradient_compression",
    "average_every", "accumulate_steps",
}  # fmt: skip


def basis_of(row):
    """How a row is predicted: "step", "ring fit" or "unshaped jobs".

    "step": from the step's all-reduces timed alone in the calibration,
    which a row sends when its flags change nothing of what they send
    but the overlap, the compression swept beside them, the period or
    how often (accumulation).
    Other rows (packs, buckets, scripts) from the ring
    fitted on the sweeps (`scaling.predict_two_nodes`), as the GPU
    projection is. parameter_server from its jobs on unshaped links.
    """
    if asynchronous(row):
        return "unshaped jobs"
    if row.get("script") or not set(row["flags"]) <= _AS_CALIBRATED:
        return "ring fit"
    return "step"


def smallest_all_reduce(result, transport):
    """Seconds of the sweep's smallest all-reduce: a step's metrics."""
    sweep = result["sweeps"][f"{transport} 2"]
    return sweep[min(sweep, key=int)]


def state_all_reduce(result, transport):
    """Seconds of an all-reduce of the weights and slots (averaging's).

    The sweep's largest (twice the gradients), scaled to the state bytes.
    """
    sweep = result["sweeps"][f"{transport} 2"]
    largest = max(sweep, key=int)
    return sweep[largest] * result["state_bytes"] / int(largest)


def step_from_calibration(result, flags, one, knobs, gradients):
    """A synchronous row's 2-node step from its calibrated all-reduces.

    Not overlapped, the step is the 1-node step and then its
    all-reduces, as timed alone. Overlapped, Horovod's through its
    cycles (`horovod_exposed`); others start as the first bucket is
    ready and run at `BUSY_CORE_SHARE` of their speed until the backward
    pass ends. The metrics' all-reduce waits for the step's end;
    accumulating, only the last micro-batch's backward pass hides them
    (`train_loop`). averaging: its metrics each step, its state
    every `average_every`. Without the communication's CPU time, which
    `predict_row` adds to every basis alike.
    """
    engine = registry.get(flags["distribution"])
    transport = transport_of(flags)
    metrics = smallest_all_reduce(result, transport)
    if engine.traffic is traffic.ALL_REDUCE_EVERY:
        state = state_all_reduce(result, transport)
        return one + metrics + state / flags.get("average_every", 1)
    alone = result["step_all_reduces_s"][transport]
    if not knobs.overlap:
        return one + alone
    micro_batches = flags.get("accumulate_steps", 1)
    backward = traffic.BACKWARD_SHARE * one / micro_batches
    if engine.transport.cycle_ms:  # Horovod's background thread.
        exposed = horovod_exposed(
            fits_of(result)[transport], knobs, gradients, backward,
            alone - metrics,
        )  # fmt: skip
        return one + exposed + metrics
    _, first_ready = gradients.buckets(knobs.pack_bytes)[0]
    hidden = BUSY_CORE_SHARE * backward * (1 - first_ready)
    return one + max(0.0, alone - metrics - hidden) + metrics


def horovod_exposed(fit, knobs, gradients, backward, alone):
    """What of Horovod's overlapped buckets the backward pass leaves.

    Horovod's background thread fuses the buckets ready at each of its
    cycles into one all-reduce (`traffic.horovod_cycles`), each paying
    the transport's cost per call, which on a link of more latency is
    several round trips (negotiation, the ring's two phases): a step pays
    it once per fused all-reduce, not once for the list. Each costs what
    the ring fitted on the sweeps says, scaled so that the step's buckets
    all ready at once take what they took timed alone (`alone`, the
    calibration's); during the backward pass at `BUSY_CORE_SHARE` of
    that speed.
    """
    buckets = gradients.buckets(knobs.pack_bytes)
    cycle = traffic.HOROVOD_CPU_CYCLE_MS / 1e3
    fusion = traffic.HOROVOD_FUSION_BYTES

    def seconds(nbytes):
        return fit(nbytes, 2)

    at_once = traffic.horovod_cycles(
        [(0.0, n) for n, _ in buckets], cycle, seconds, fusion_bytes=fusion
    )
    scale = alone / at_once
    done = traffic.horovod_cycles(
        [(ready * backward, n) for n, ready in buckets], cycle,
        lambda nbytes: scale * seconds(nbytes), backward, BUSY_CORE_SHARE,
        fusion,
    )  # fmt: skip
    return max(0.0, done - backward)


def holding_seconds(result, flags, two, one):
    """A row's 2-node step with what the emulated latency's holding costs.

    The delayers hold the packets on the machine's two cores
    (`network_worker.holding_probe`, in the calibration: both delayers'
    CPU time per second, idle, and per byte all-reduced). A step of `two`
    seconds that sends `nbytes` costs them `idle two + per_byte nbytes`,
    half of it on each node's core; what lands while a node waits for the
    link costs it nothing, so a node loses the share of it that lands
    while it computes (`one` of the `two` seconds). Without added latency
    (no delayers), `two`.
    """
    engine = registry.get(flags["distribution"])
    probe = result.get("holding", {}).get(transport_of(flags))
    if not probe:
        return two
    if engine.traffic is traffic.ALL_REDUCE_EVERY:
        nbytes = result["state_bytes"] / flags.get("average_every", 1)
    else:
        nbytes = result["gradient_bytes"]
    held = probe["idle_cpu_per_s"] * two + probe["cpu_per_byte"] * nbytes
    return two + held / 2 * min(1.0, one / two)


def predict_row(result, row, one, gradients, unshaped=None):
    """The model's 2-node step of a row whose 1-node step is `one`.

    Args:
      result: the model's calibration (`calibrate`: the link, the sweeps,
        the step's all-reduces alone).
      row: `{"name", "flags", "script", "inter_op_threads"}`.
      one: the row's 1-node step, seconds.
      gradients: the model's `traffic.Gradients` (`gradients_of`).
      unshaped: parameter_server's steps on unshaped links, 1 node and 2.

    Returns:
      `(seconds, the communication's CPU time added to them)`.
    """
    flags = row["flags"]
    engine = registry.get(flags["distribution"])
    if engine.traffic is traffic.PUSH_PULL:
        # One worker's pull and push: its 1-node step less the same job's
        # on unshaped links. The step without the network on two nodes is
        # the 2-node job's on unshaped links, as the twin 1-node jobs are
        # the synchronous engines': here the two workers, the ps and the
        # coordinator share the machine's two cores (the workers, unpinned,
        # each compute on both when alone), which on a cluster they do not.
        fit = scaling.RingFit(
            0, 0, 2 * result["gradient_bytes"] / (one - unshaped[0])
        )
        base = 2 * unshaped[1]  # A worker's step: two per update.
        step = scaling.predict_two_nodes(
            engine, knobs_of(flags), base, fit, gradients
        )
        return step, 0.0
    transport = transport_of(flags)
    knobs = knobs_of(
        flags, row.get("script", ""), result["bucket_bytes"],
        threads_of(result, row),
    )  # fmt: skip
    if basis_of(row) == "step":
        step = step_from_calibration(result, flags, one, knobs, gradients)
    else:
        step = scaling.predict_two_nodes(
            engine, knobs, one, fits_of(result)[transport], gradients
        )
    cpu = 0.0
    if engine.overlaps and knobs.overlap:
        cpu = communication_cpu(
            cpu_fits_of(result)[transport], knobs, gradients
        )
    return holding_seconds(result, flags, step + cpu, one), cpu


def asynchronous(row):
    """Whether a saved row's engine is asynchronous (parameter_server)."""
    return registry.get(row["flags"]["distribution"]).asynchronous


def predict_round(result, selected, runs, round_, gradients):
    """One round's predictions of every 2-node step, from its 1-node jobs.

    Inputs: the calibration (`calibrate`: link, iperf3, sweeps), each
    row's 1-node jobs of the round (parameter_server's on unshaped links
    too), the model's layer table and the rows' knobs. Returns the entry
    the predictions file holds (`scaling_score.prediction_entry`).
    """
    known = {}
    for row in selected:
        samples = runs[row.name]

        def step(key, samples=samples):
            return statistics.median(samples[key][round_]["step_s"])

        known[row.name] = {
            "name": row.name,
            "flags": row.flags,
            "script": row.script,
            "inter_op_threads": samples["1"][round_]["inter_op_threads"],
            "1": {"rounds": [step("1")]},
        }
        if "1 unshaped" in samples:
            known[row.name]["unshaped_s"] = [
                step(f"{n} unshaped") for n in (1, 2)
            ]
    best = scaling_score.best_single_node(list(known.values()), asynchronous)
    predictions = []
    for name, row in known.items():
        one = row["1"]["rounds"][0]
        two, cpu = predict_row(
            result, row, one, gradients, row.get("unshaped_s")
        )
        predicted = {**row, "2": {"rounds": [two]}}
        efficiency = scaling_score.efficiency(
            predicted, best, asynchronous(row)
        )[0]
        predictions.append({
            "row": name, "one_node_s": one, "two_nodes_s": two,
            "communication_cpu_s": cpu, "efficiency": efficiency,
            "basis": basis_of(row),
            "against": "own 1-node job" if asynchronous(row)
            else "best single node",
        })  # fmt: skip
    inputs = prediction_inputs(result, known, best)
    return scaling_score.prediction_entry(
        result["model"], round_, inputs, predictions
    )


def prediction_inputs(result, known, best):
    """What a round's predictions were made from, saved beside them."""
    return {
        "link_mbit": result["link_mbit"],
        "iperf3_mbit": result["iperf3_mbit"],
        "delay_ms": result.get("delay_ms", 0.0),
        "gradient_bytes": result["gradient_bytes"],
        "bucket_bytes": result["bucket_bytes"],
        "ring_fits": {
            t: dataclasses.asdict(f) for t, f in fits_of(result).items()
        },
        "cpu_fits": cpu_fits_of(result),
        "step_all_reduces_s": result["step_all_reduces_s"],
        "holding": result.get("holding", {}),
        "busy_core_share": BUSY_CORE_SHARE,
        "best_single_node": {"step_s": best[0][0], "row": best[0][1]}
        if best
        else None,
        "rows": known,
    }


class PredictionsFile:
    """The predictions file of a run, rewritten as each round's is added."""

    def __init__(self, path, log):
        self.path = path
        self.log = log
        self.entries = []

    def add(self, entry):
        """Writes `entry` with those before it and logs its hash."""
        self.entries.append(entry)
        scaling_score.write_predictions(self.path, self.entries)
        self.log(
            f"  {entry['model']}: round {entry['round'] + 1}'s predictions "
            f"written to {self.path} at {entry['written']}, sha256 "
            f"{entry['sha256']}; now the 2-node jobs"
        )
