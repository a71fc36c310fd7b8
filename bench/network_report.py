"""The Markdown tables of a saved network_scaling run (its `--out` file).

`load_report` reads the run and its predictions file, the hashes
checked; `report` prints, per model, the calibration, the efficiency
rows, the predictions scored against them, and the measurements beside
them (stragglers, CPU time, parameter_server's network and CPU, the
averaging all-reduce, a step's communication alone).
"""

import json
import statistics
import sys

import scaling_score
from network_predict import asynchronous, cpu_fits_of, fits_of, transport_of

from tf_resnet import scaling


def report(results, predictions=None):
    """The Markdown tables of `results` (the `--out` file).

    `predictions`: the entries of its predictions file, as written before
    the 2-node jobs (`scaling_score.read_predictions`); None for a run
    saved before the bench wrote them.
    """
    lines = [f"{results['cpu']}, {results['date']}", ""]
    for result in results["models"]:
        fits = fits_of(result)
        lines += report_calibration(result, fits)
        lines += report_efficiency(result)
        lines += report_predictions(result, predictions)
        lines += report_stragglers(result)
        lines += report_cpu(result)
        lines += report_ps_network(result)
        lines += report_ps_cpu(result, results.get("cores", 2))
        lines += report_averaging(result, fits)
        lines += report_communication(result)
        lines += report_holding(result, results.get("cores", 2))
        lines.append("")
    return "\n".join(lines)


def report_calibration(result, fits):
    """The link, the all-reduce sweeps and the ring fits."""
    link = result["link_mbit"] * 1e6 / 8
    lines = [
        f"### {result['model']}, batch {result['batch_per_process']} per "
        f"process, {result['network']} seen from a GPU",
        "",
        f"CPU step {1e3 * result['cpu_step_s']:.0f} ms, GPU step "
        f"{scaling.GPU_STEPS[result['model']].ms:.2f} ms: s = "
        f"{result['slowdown']:.1f}; link {result['link_mbit']:.1f} Mbit/s, "
        f"iperf3 goodput {result['iperf3_mbit']:.1f} Mbit/s "
        f"({100 * result['iperf3_mbit'] / result['link_mbit']:.1f}%); "
        + (
            f"one-way delay {result['delay_ms']:.2f} ms "
            f"({result['latency_us']:.0f} us from a GPU), ping round trip "
            f"{result['round_trip_ms']:.2f} ms; "
            if result.get("latency_us")
            else ""
        )
        + f"gradients {result['gradient_bytes'] / 1e6:.2f} MB",
        "",
        "| all-reduce | size MB | measured ms | fit ms | error | CPU ms |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for key, sweep in result["sweeps"].items():
        transport, processes = key.split()
        cpu = result.get("sweep_cpu_s", {}).get(key, {})
        for nbytes, seconds in sweep.items():
            fitted = fits[transport](int(nbytes), int(processes))
            lines.append(
                f"| {transport}, {processes} processes | "
                f"{int(nbytes) / 1e6:.3f} | {1e3 * seconds:.1f} | "
                f"{1e3 * fitted:.1f} | "
                f"{100 * (fitted / seconds - 1):+.0f}% | "
                + (f"{1e3 * cpu[nbytes]:.1f} |" if nbytes in cpu else "- |")
            )
    lines += ["", "| transport | c ms | a ms | B MB/s | B / link | "
              "CPU per call ms | CPU per MB ms |",
              "| --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    cpu_fits = cpu_fits_of(result)
    for transport, fit in fits.items():
        cpu = cpu_fits.get(transport)
        lines.append(
            f"| {transport} | {1e3 * fit.c:.2f} | {1e3 * fit.a:.3f} | "
            f"{fit.bandwidth / 1e6:.1f} | {fit.bandwidth / link:.2f} | "
            + (
                f"{1e3 * cpu['per_call_s']:.2f} | "
                f"{1e9 * cpu['per_byte_s']:.2f} |"
                if cpu
                else "- | - |"
            )
        )
    return lines


def report_efficiency(result):
    """Each row's efficiency against the best single node of the run."""
    rows = result["rows"]
    best = scaling_score.best_single_node(rows, asynchronous)
    lines = [
        "",
        "Efficiency: 2-node throughput over twice the best 1-node "
        "throughput of the run, each round's (the fastest 1-node job per "
        "micro-batch of any synchronous row, whatever its threads or "
        "engine): "
        + "; ".join(f"{1e3 * s:.0f} ms ({name})" for s, name in best)
        + ". A row is its median over the rounds (min-max). "
        "parameter_server: against its own 1-node job, in updates per "
        "second (that job runs a ps and a coordinator beside its worker, "
        "not one node alone). The last column, against the row's own "
        "1-node step, is not what a user compares with.",
        "",
        "| row | inter-op threads | 1 node ms | 2 nodes ms, each round | "
        "efficiency, each round | **efficiency** | against its own "
        "1-node step |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        each = scaling_score.efficiency(row, best, asynchronous(row))
        own = scaling_score.spread(scaling_score.own_efficiency(
            row, asynchronous(row)
        ))  # fmt: skip
        middle, low, high = scaling_score.spread(each)
        lines.append(
            f"| {row['name']} | {row.get('inter_op_threads', '-')} | "
            f"{1e3 * row['1']['step_s']:.0f} | "
            + ", ".join(f"{1e3 * t:.0f}" for t in row["2"].get(
                "rounds", [row["2"]["step_s"]]))
            + f" | {', '.join(f'{100 * e:.0f}%' for e in each)} | "
            f"**{100 * middle:.0f}%** ({100 * low:.0f}-{100 * high:.0f}%)"
            + (" (own)" if asynchronous(row) else "")
            + f" | {100 * own[0]:.0f}% ({100 * own[1]:.0f}-"
            f"{100 * own[2]:.0f}%) |"
        )  # fmt: skip
    return lines


def report_predictions(result, entries):
    """The predictions written before the 2-node jobs, scored."""
    mine = [e for e in entries or () if e["model"] == result["model"]]
    if not mine:
        return [
            "",
            "No predictions of this model's 2-node steps were written "
            "before its 2-node jobs (a run saved before the bench wrote "
            "them): none is scored.",
        ]
    predicted, steps, cpu, basis = {}, {}, {}, {}
    for entry in sorted(mine, key=lambda e: e["round"]):
        for p in entry["predictions"]:
            # Predictions written before the basis was recorded: the ring.
            basis[p["row"]] = p.get("basis", "ring fit")
            predicted.setdefault(p["row"], []).append(p["efficiency"])
            steps.setdefault(p["row"], []).append(p["two_nodes_s"])
            cpu.setdefault(p["row"], []).append(p["communication_cpu_s"])
    rows = result["rows"]
    best = scaling_score.best_single_node(rows, asynchronous)
    measured = {
        row["name"]: scaling_score.efficiency(row, best, asynchronous(row))
        for row in rows
    }
    points, within, scored = scaling_score.score(predicted, measured)
    lines = [
        "",
        "Predictions, written before the 2-node jobs (each round's file "
        "entry, hash checked), against the measurements; points: measured "
        "less predicted efficiency, the target within "
        f"±{scaling_score.TARGET_POINTS:g}. Predicted from: `step`, the "
        "step's all-reduces timed alone in the calibration; `ring fit`, "
        "the ring fitted on its sweeps; `unshaped jobs`, parameter_server's "
        "jobs on unshaped links.",
        "",
        "| row | predicted from | predicted 2 nodes ms | measured ms "
        "| communication CPU added ms | predicted efficiency | measured "
        "| points, each round | points |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    by_name = {row["name"]: row for row in rows}
    for name, each in points.items():
        lines.append(
            f"| {name} | {basis[name]} | {_each(steps[name], 1e3, '.0f')} | "
            f"{_each(scaling_score.rounds_of(by_name[name], '2'), 1e3, '.0f')}"
            f" | {_each(cpu[name], 1e3, '.0f')} | "
            f"{_each(predicted[name], 100, '.0f', '%')} | "
            f"{_each(measured[name], 100, '.0f', '%')} | "
            f"{_each(each, 1, '+.1f')} | "
            f"{statistics.median(each):+.1f} |"
        )
    lines += [
        "",
        f"Within ±{scaling_score.TARGET_POINTS:g} points (a row by its "
        f"median over rounds): {within} of {scored} rows. Written: "
        + "; ".join(
            f"round {e['round'] + 1} at {e['written']}, sha256 "
            f"{e['sha256'][:16]}"
            for e in mine
        )
        + ".",
    ]
    return lines


def _each(values, scale, spec, unit=""):
    """`values` scaled, formatted, each followed by `unit`, joined."""
    return ", ".join(f"{scale * v:{spec}}{unit}" for v in values)


def report_stragglers(result):
    """Each round's 1-node step as the slower node's, and paired."""
    lines = []
    for row in result["rows"]:
        if "paired_s" not in row["1"]:
            continue
        pairs = zip(row["1"]["paired_s"], row["1"]["slower_mean_s"],
                    strict=True)  # fmt: skip
        lines += [
            "",
            f"{row['name']}, stragglers: each round's 1-node step as "
            "the slower node's mean, and as the mean of the slower of "
            "every pair of the two nodes' steps (between all-reduces; "
            "a synchronous step waits for the slower node): "
            + "; ".join(
                f"{1e3 * slower:.0f}, {1e3 * paired:.0f} ms"
                for paired, slower in pairs
            )
            + ".",
        ]
    return lines


def report_cpu(result):
    """The chief's CPU time per step on 1 node and 2, measured after."""
    lines = []
    for row in result["rows"]:
        if not row["2"].get("process_cpu_s"):
            continue
        pairs = list(zip(row["1"]["process_cpu_s"],
                         row["2"]["process_cpu_s"], strict=True))  # fmt: skip
        lines += [
            "",
            f"{row['name']}: the chief's CPU time per step, 1 node and "
            "2 nodes, each round: "
            + "; ".join(f"{1e3 * o:.0f}, {1e3 * t:.0f} ms" for o, t in pairs)
            + "; the difference: "
            + ", ".join(f"{1e3 * max(0.0, t - o):.0f}" for o, t in pairs)
            + " ms (measured with the 2-node jobs, so not a prediction's "
            "input: the predictions estimate it from the sweeps).",
        ]
        if asynchronous(row):
            continue
        # A node's one core cannot run a step in less than the
        # process's CPU time per step: however well the all-reduce
        # hides, the efficiency is at most the 1-node step over it.
        ceilings = zip(row["1"]["rounds"], row["2"]["process_cpu_s"],
                       strict=True)  # fmt: skip
        lines[-1] += (
            " The most a node of one core allows, each round's 1-node "
            "step over its 2-node CPU time per step: "
            + ", ".join(f"{100 * o / c:.0f}%" for o, c in ceilings)
            + "."
        )
    return lines


def report_ps_network(result):
    """parameter_server's pull and push, from its unshaped jobs."""
    lines = []
    link = result["link_mbit"] * 1e6 / 8
    for row in result["rows"]:
        if "1 unshaped" not in row:
            continue
        pairs = zip(row["1"]["rounds"], row["1 unshaped"]["rounds"],
                    strict=True)  # fmt: skip
        network = [one - fast for one, fast in pairs]
        lines += [
            "",
            f"{row['name']}: one worker's pull and push, its 1-node "
            "step less the same job's on unshaped links, each round: "
            + ", ".join(f"{1e3 * t:.0f}" for t in network)
            + " ms; as a bandwidth ("
            f"{2 * result['gradient_bytes'] / 1e6:.2f} MB over it), "
            + ", ".join(
                f"{2 * result['gradient_bytes'] / t / link:.2f}"
                for t in network
            )
            + " of the link's rate.",
        ]
    return lines


def report_ps_cpu(result, cores):
    """parameter_server's CPU time per update, by process."""
    lines = []
    for row in result["rows"]:
        # Runs saved before only parameter_server's jobs measured it
        # have the CPU time of other chiefs alone.
        if "ps" not in row["2"].get("cpu_s", [{}])[0]:
            continue
        lines += [
            "",
            f"{row['name']}: CPU time per update over the timed steps, "
            "each round (the chief is the coordinator), against the "
            f"step; all of it over the machine's {cores} cores is a "
            "floor under the step:",
            "",
            "| nodes | round | ps ms | workers ms | coordinator ms | "
            f"all ms | all over {cores} cores ms | step ms |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for nodes in ("1", "2", "1 unshaped", "2 unshaped"):
            if nodes not in row:
                continue
            pairs = zip(row[nodes]["cpu_s"], row[nodes]["rounds"],
                        strict=True)  # fmt: skip
            for i, (cpu, step) in enumerate(pairs):
                workers = sum(
                    t for n, t in cpu.items() if n.startswith("worker")
                )
                every = sum(cpu.values())
                lines.append(
                    f"| {nodes} | {i + 1} | {1e3 * cpu['ps']:.0f} | "
                    f"{1e3 * workers:.0f} | {1e3 * cpu['chief']:.0f} | "
                    f"{1e3 * every:.0f} | {1e3 * every / cores:.0f} | "
                    f"{1e3 * step:.0f} |"
                )
    return lines


def report_averaging(result, fits):
    """The averaging engine's own all-reduce, against the fit."""
    lines = []
    for row in result["rows"]:
        if "average_s" not in row["2"]:
            continue
        nbytes = result.get("state_bytes", 2 * result["gradient_bytes"])
        fitted = fits[transport_of(row["flags"])](nbytes, 2)
        each = _each(row["2"]["average_s"], 1e3, ".0f")
        lines += [
            "",
            f"{row['name']}: its all-reduce of {nbytes / 1e6:.1f} MB "
            f"(weights, statistics, slots) alone in the 2-node jobs: "
            f"{each} ms (each round's fastest of 3); the fit: "
            f"{1e3 * fitted:.0f} ms.",
        ]
    return lines


def report_holding(result, cores):
    """What holding the packets (the links' latency) took of the cores."""
    shares = [
        f"{row['name']} "
        + ", ".join(
            f"{100 * held / (wall * cores):.1f}%"
            for held, wall in zip(
                row["2"]["holding_cpu_s"], row["2"]["wall_s"], strict=True
            )
        )
        for row in result["rows"]
        if "holding_cpu_s" in row["2"]
    ]
    if not shares:
        return []
    probes = [
        f"{transport} {100 * probe['idle_cpu_per_s']:.1f}% of a core idle "
        f"and {1e3 * probe['cpu_per_byte'] * 2**20:.2f} ms a MiB all-reduced"
        for transport, probe in result.get("holding", {}).items()
    ]
    return [
        "",
        "Holding the packets (the links' latency): the delayers' CPU time "
        f"over each round's 2-node job, as a share of its time on the {cores}"
        " cores (the kernel's work for them in; taken from the nodes' "
        "computation, which on a real network it is not): "
        + "; ".join(shares)
        + "."
        + (
            " The predictions add what the calibration's probe measured "
            "before the jobs, both delayers: " + "; ".join(probes) + "."
            if probes
            else ""
        ),
    ]


def report_communication(result):
    """A step's all-reduces alone, and its computation alone."""
    lines = []
    for row in result["rows"]:
        if "communication_s" not in row["2"]:
            continue
        n = result["gradient_bytes"]
        transport = transport_of(row["flags"])
        sizes = result["sweeps"][f"{transport} 2"]
        each = _each(row["2"]["communication_s"], 1e3, ".0f")
        calibrated = result.get("step_all_reduces_s", {}).get(transport)
        lines += [
            "",
            f"{row['name']}: its step's all-reduces alone in the 2-node "
            f"jobs (the gradients as a list of {result['tensors']} "
            f"tensors, then the metrics): {each} ms (each round's "
            "fastest of 3)"
            + (
                f", in the calibration before them {1e3 * calibrated:.0f}"
                " ms (the predictions' input)"
                if calibrated
                else ""
            )
            + "; the sweep's one tensor of "
            f"{n / 1e6:.2f} MB: {1e3 * sizes[str(n)]:.0f} ms; the 2-node "
            "step less the 1-node step, each round: "
            + ", ".join(
                f"{1e3 * (t - o):.0f}"
                for o, t in zip(
                    row["1"]["rounds"], row["2"]["rounds"], strict=True
                )
            )
            + " ms.",
        ]
        if "compute_s" in row["2"]:
            rounds = zip(row["2"]["compute_s"], row["2"]["communication_s"],
                         row["2"]["rounds"], strict=True)  # fmt: skip
            lines[-1] += (
                " Its step without the all-reduces, timed in the 2-node "
                "jobs with both nodes computing, plus the all-reduces "
                "alone, against the 2-node step, each round: "
                + "; ".join(
                    f"{1e3 * c:.0f} + {1e3 * a:.0f} = {1e3 * (c + a):.0f}"
                    f" against {1e3 * t:.0f} ms"
                    for c, a, t in rounds
                )
                + "."
            )
    return lines


def load_report(path):
    """A saved run and its predictions file, the hashes checked."""
    with open(path) as stream:
        results = json.load(stream)
    logged = [
        h for m in results["models"] for h in m.get("prediction_sha256", [])
    ]
    if not logged:
        return results, None
    predictions = scaling_score.predictions_path(path)
    try:
        return results, scaling_score.read_predictions(predictions, logged)
    except FileNotFoundError:
        sys.exit(
            f"network_scaling: {path} logged predictions, but their file "
            f"{predictions} is missing (keep it beside the --out file)"
        )
    except (KeyError, json.JSONDecodeError) as error:
        sys.exit(f"network_scaling: {predictions}: not a predictions file "
                 f"({error!r})")  # fmt: skip
    except ValueError as error:  # It names the file.
        sys.exit(f"network_scaling: {error}")
