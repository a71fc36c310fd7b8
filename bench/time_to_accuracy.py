"""Time to accuracy: our training recipes against the PyTorch twin.

  .venv/bin/python bench/time_to_accuracy.py [--seeds=3] [--epochs=30]
      [--contenders=ours:paper,ours:fast,torch:fast] [--suite=cifar10]

Each contender trains a network from scratch on a real data sample (the
CIFAR-10 binaries or the 10-class TinyImageNet in $BENCH_DATA_DIR, as
bench/common.py reads it) and is evaluated on its test split after every
epoch. Contenders run one at a time on the same machine in one invocation,
alternating seed by seed with the
order rotated every seed, so drifting load from elsewhere hits all alike.

Contenders are `framework:recipe[:key=value]...`:
  ours:paper  `resnet_main.py --recipe=paper` and the PAPER knobs below
  ours:fast   `resnet_main.py --recipe=fast` and the FAST knobs below
  torch:fast  `bench/torch_train.py` with the same FAST knobs
  torch:paper the twin with the PAPER knobs
and `key=value` overrides one knob, e.g. `ours:fast:ema_decay=0.999`. The
knobs are passed explicitly to both frameworks from one table, so `ours:fast`
and `torch:fast` train with the same recipe by construction. `dtype=` sets
the precision, which is not part of a recipe: each framework's default
unless given (ours `--dtype=auto`, the twin float32), so `ours:fast` against
`torch:fast` is "each at its default precision" and
`torch:fast:dtype=mixed_bfloat16` (autocast) the twin at ours' bfloat16.
The table names the precision each contender ran at.

Timing is measured here, identically for every contender: wall seconds
from the process launch to the moment each epoch's result appears (ours: a
new row in `log_root/eval.csv`, polled; torch: the epoch's JSON line), so
start-up, per-epoch evaluation and checkpointing count as a user sees them.
images/sec is the training throughput between the first and the last
evaluation, evaluation included; "s to 1st eval" the start-up plus the
first epoch and its evaluation, where tracing and warm-up fall. A time to a
target is about the first of these plus the epochs after the first at the
images/sec rate, so the two columns say whether a gap in time is start-up
or speed.

Output: per contender the median over seeds of the final and best test
accuracy, of the epochs and the seconds to reach each target accuracy (with
the share of seeds that did), the seconds to the first evaluation,
images/sec and total seconds, as a Markdown
table naming the CPU; the raw curves as JSON in `--work_dir`; and a plot of
accuracy against wall seconds, one line per contender (medians over seeds).
"""

import argparse
import csv
import datetime
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# This process imports TensorFlow only to name the CPU and resolve
# `--dtype=auto`; its start-up log would bury the table, as in the runs.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import common  # noqa: E402

from tf_resnet.config import settings  # noqa: E402
from tf_resnet.config.presets import RECIPES  # noqa: E402

ROOT = common.ROOT
BENCH = os.path.dirname(os.path.abspath(__file__))
BATCH = 128
POLL_SECONDS = 0.25

# The knobs both frameworks understand. Their values come from the
# project's own recipe table (`tf_resnet.config.presets.RECIPES`), so
# `ours:fast` is exactly `resnet_main.py --recipe=fast` and `torch:fast`
# the same recipe in PyTorch.
KNOBS = (
    "lr_schedule",
    "learning_rate",
    "warmup_fraction",
    "final_lr_fraction",
    "nesterov",
    "weight_decay",
    "label_smoothing",
    "normalization",
    "eval_tta",
    "ema_decay",
    "mixup_alpha",
    "cutmix_alpha",
    "cutout_size",
    "zero_init_residual",
    "head_lr_multiplier",
)


def recipe_knobs(name):
    """The knobs of `--recipe=name` as resnet_main.py resolves them."""
    values = settings.flatten(settings.make_config(**RECIPES[name]))
    return {key: values[key] for key in KNOBS}


# The precisions each framework takes, its default first (`dtype=`).
DTYPES = {
    "ours": ("auto", "float32", "mixed_bfloat16"),
    "torch": ("float32", "mixed_bfloat16"),
}

# Knobs of ours that the PyTorch twin does not implement, at the values
# that leave them off.
TORCH_LACKS = {
    "mixup_alpha": 0.0,
    "cutmix_alpha": 0.0,
    "cutout_size": 0,
    "head_lr_multiplier": 1.0,
}

SUITES = {
    "cifar10": {
        "data": "cifar10",
        "model": "resnet20",
        "contenders": "ours:paper,ours:fast,torch:fast",
        "targets": "0.6,0.7,0.75",
        "plot": os.path.join(BENCH, "time_to_accuracy.png"),
    },
    "tinyimagenet": {
        "data": "tinyimagenet",
        "model": "course_resnet",
        # The classifier at the course presets' rate (docs/recipes.md).
        "contenders": "ours:paper:head_lr_multiplier=0.05,"
        "ours:fast:head_lr_multiplier=0.05",
        "targets": "0.4,0.5,0.6",
        "plot": os.path.join(BENCH, "time_to_accuracy_tinyimagenet.png"),
    },
}


class Contender:
    """One `framework:recipe[:key=value]...` name, parsed and checked."""

    def __init__(self, name):
        self.name = name
        parts = name.split(":")
        if len(parts) < 2 or parts[0] not in ("ours", "torch"):
            raise SystemExit(
                f"contender {name!r}: expected ours|torch:paper|fast"
                "[:key=value]..."
            )
        self.framework, recipe = parts[0], parts[1]
        if recipe not in RECIPES:
            raise SystemExit(f"contender {name!r}: unknown recipe {recipe!r}")
        self.recipe = recipe
        self.knobs = recipe_knobs(recipe)
        self.overrides = {}
        self.dtype = DTYPES[self.framework][0]
        for override in parts[2:]:
            key, _, value = override.partition("=")
            if key == "dtype":
                if value not in DTYPES[self.framework]:
                    raise SystemExit(
                        f"contender {name!r}: dtype of {self.framework} is "
                        f"one of {', '.join(DTYPES[self.framework])}"
                    )
                self.dtype = value
                continue
            if key not in self.knobs or not value:
                raise SystemExit(
                    f"contender {name!r}: {override!r} is not key=value with "
                    f"a key of dtype, {', '.join(self.knobs)}"
                )
            self.knobs[key] = _parse_like(value, self.knobs[key])
            self.overrides[key] = self.knobs[key]
        if self.framework == "torch":
            used = [k for k, off in TORCH_LACKS.items() if self.knobs[k] != off]
            if used:
                raise SystemExit(
                    f"contender {name!r}: the PyTorch twin has no "
                    f"{', '.join(used)}"
                )


def resolved_dtype(contender):
    """The precision the contender trains at, `auto` resolved as ours does.

    The runs inherit this process's environment and CPU, so resolving here
    gives the policy `resnet_main.py` picks in them.
    """
    if contender.dtype != "auto":
        return contender.dtype
    from tf_resnet import runtime  # Imports TensorFlow: only when needed.

    return runtime.resolve_dtype("auto")


def _parse_like(text, example):
    if isinstance(example, bool):
        if text.lower() not in ("true", "false", "1", "0"):
            raise SystemExit(f"{text!r} is not a boolean")
        return text.lower() in ("true", "1")
    return type(example)(text)


def ours_command(contender, suite, epochs, seed, log_root):
    """`resnet_main.py --recipe=...`, plus the contender's overrides only."""
    data = common.DATA[suite["data"]]
    command = [
        sys.executable,
        os.path.join(ROOT, "resnet_main.py"),
        f"--dataset={data['dataset']}",
        f"--model={suite['model']}",
        f"--log_root={log_root}",
        f"--train_epochs={epochs}",
        f"--batch_size={BATCH}",
        f"--seed={seed}",
        f"--recipe={contender.recipe}",
        f"--dtype={contender.dtype}",
    ]
    for key, value in contender.overrides.items():
        if isinstance(value, bool):
            command.append(f"--{key}" if value else f"--no{key}")
        else:
            command.append(f"--{key}={value}")
    if suite["data"] == "cifar10":
        train = os.path.join(common.CIFAR_DIR, "data_batch*")
        test = os.path.join(common.CIFAR_DIR, "test_batch*")
    else:  # A TinyImageNet root holds both splits.
        train = test = data["path"]
    command += [f"--train_data_path={train}", f"--eval_data_path={test}"]
    return command


def torch_command(contender, suite, epochs, seed):
    """`bench/torch_train.py` with the same knobs."""
    if suite["data"] != "cifar10":
        raise SystemExit(
            f"{contender.name}: the PyTorch twin trains on CIFAR-10 only"
        )
    knobs = contender.knobs
    return [
        sys.executable,
        os.path.join(BENCH, "torch_train.py"),
        f"--data_dir={common.CIFAR_DIR}",
        f"--model={suite['model']}",
        f"--epochs={epochs}",
        f"--batch_size={BATCH}",
        f"--seed={seed}",
        f"--dtype={contender.dtype}",
        f"--lr_schedule={knobs['lr_schedule']}",
        f"--learning_rate={knobs['learning_rate']}",
        f"--warmup_epochs={knobs['warmup_fraction'] * epochs:g}",
        f"--final_lr_fraction={knobs['final_lr_fraction']}",
        "--nesterov" if knobs["nesterov"] else "--no-nesterov",
        f"--weight_decay={knobs['weight_decay']}",
        f"--label_smoothing={knobs['label_smoothing']}",
        f"--normalization={knobs['normalization']}",
        f"--eval_tta={knobs['eval_tta']}",
        f"--ema_decay={knobs['ema_decay']}",
        *(["--zero_init_residual"] if knobs["zero_init_residual"] else []),
    ]


def run_ours(command, log_root, log_path):
    """Runs `resnet_main.py`; returns the epochs' `(epoch, step, acc, s)`."""
    csv_path = os.path.join(log_root, "eval.csv")
    points, seen = [], set()
    start = time.perf_counter()
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=_env()
        )
        while True:
            finished = process.poll() is not None
            now = time.perf_counter() - start
            for row in _read_rows(csv_path):
                step = int(row["step"])
                if step not in seen:
                    seen.add(step)
                    point = {
                        "epoch": float(row["epoch"]),
                        "step": step,
                        "accuracy": float(row["precision"]),
                        "seconds": now,
                    }
                    points.append(point)
                    _progress(point)
            if finished:
                break
            time.sleep(POLL_SECONDS)
    _check_exit(process.returncode, command, log_path)
    return points, time.perf_counter() - start


def _read_rows(csv_path):
    try:
        with open(csv_path, newline="") as stream:
            return list(csv.DictReader(stream))
    except FileNotFoundError:
        return []


def run_torch(command, log_path):
    """Runs the twin; returns the epochs' points and the total seconds."""
    points = []
    start = time.perf_counter()
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            cwd=ROOT,
            env=_env(),
        )
        for line in process.stdout:
            now = time.perf_counter() - start
            log.write(line)
            record = json.loads(line)
            if "epoch" in record:
                point = {
                    "epoch": float(record["epoch"]),
                    "step": int(record["step"]),
                    "accuracy": float(record["test_accuracy"]),
                    "seconds": now,
                }
                points.append(point)
                _progress(point)
        process.wait()
    _check_exit(process.returncode, command, log_path)
    return points, time.perf_counter() - start


def _env():
    return {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}


def _progress(point):
    print(
        f"    epoch {point['epoch']:5.2f}: {100 * point['accuracy']:.2f}% "
        f"at {point['seconds']:.1f} s",
        flush=True,
    )


def _check_exit(code, command, log_path):
    if code:
        with open(log_path) as stream:
            tail = "".join(stream.readlines()[-15:])
        raise SystemExit(
            f"exit {code}: {' '.join(command)}\n(log {log_path})\n{tail}"
        )


def summarize(runs, targets):
    """Medians over the seeds of one contender's runs."""
    finals = [run["points"][-1]["accuracy"] for run in runs]
    bests = [max(p["accuracy"] for p in run["points"]) for run in runs]
    summary = {
        "seeds": len(runs),
        "final": common.Stats(finals),
        "best": common.Stats(bests),
        "first_eval_seconds": statistics.median(
            run["points"][0]["seconds"] for run in runs
        ),
        "images_per_sec": statistics.median(_rate(run) for run in runs),
        "total_seconds": statistics.median(run["seconds"] for run in runs),
        "to_target": {},
    }
    for target in targets:
        reached = [_first_reaching(run["points"], target) for run in runs]
        hits = [point for point in reached if point is not None]
        summary["to_target"][target] = {
            "reached": len(hits),
            # Runs that never reach the target count as infinitely slow.
            "epochs": _median_or_none(
                [p["epoch"] if p else math.inf for p in reached]
            ),
            "seconds": _median_or_none(
                [p["seconds"] if p else math.inf for p in reached]
            ),
        }
    return summary


def _rate(run):
    first, last = run["points"][0], run["points"][-1]
    if last["seconds"] <= first["seconds"]:
        return math.nan
    return (
        (last["step"] - first["step"])
        * BATCH
        / (last["seconds"] - first["seconds"])
    )


def _first_reaching(points, target):
    return next((p for p in points if p["accuracy"] >= target), None)


def _median_or_none(values):
    value = statistics.median(values)
    return None if math.isinf(value) else value


def print_table(results, targets, suite_name, epochs, cpu, saved=False):
    """The Markdown table of runs on `cpu`; `saved`: loaded, not run now."""
    header = ["contender", "precision", "final acc %", "best acc %"]
    for target in targets:
        header += [f"epochs to {100 * target:g}%", f"s to {100 * target:g}%"]
    header += ["s to 1st eval", "images/sec", "total s"]
    rows = []
    for name, runs in results.items():
        summary = summarize(runs, targets)
        # Results saved before runs recorded their precision show "?".
        dtypes = sorted({run.get("dtype", "?") for run in runs})
        row = [
            name,
            "/".join(dtypes),
            _percent(summary["final"]),
            _percent(summary["best"]),
        ]
        for target in targets:
            entry = summary["to_target"][target]
            share = f" ({entry['reached']}/{summary['seeds']})"
            share = "" if entry["reached"] == summary["seeds"] else share
            row += [
                _maybe(entry["epochs"], 0) + share,
                _maybe(entry["seconds"], 0) + share,
            ]
        row += [
            f"{summary['first_eval_seconds']:.1f}",
            f"{summary['images_per_sec']:.0f}",
            f"{summary['total_seconds']:.0f}",
        ]
        rows.append(row)
    seeds = max(len(runs) for runs in results.values())
    # Printed from saved runs, the load and date of now say nothing.
    when = "from saved results"
    if not saved:
        when = (
            f"load {common.load_average():.2f} at end, {datetime.date.today()}"
        )
    title = (
        f"{suite_name}, {SUITES[suite_name]['model']}, {epochs} epochs, "
        f"batch {BATCH}, medians over {seeds} seed(s) (min-max); "
        f"{cpu}, {when}"
    )
    common.print_table(title, header, rows)


def _percent(stats):
    return (
        f"{100 * stats.median:.1f} ({100 * stats.min:.1f}-"
        f"{100 * stats.max:.1f})"
    )


def _maybe(value, digits):
    return "-" if value is None else f"{value:.{digits}f}"


def plot(results, path, title):
    """Accuracy against wall seconds: medians over seeds per epoch."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, axes = pyplot.subplots(figsize=(7, 4.5), dpi=100)
    for name, runs in results.items():
        epochs = min(len(run["points"]) for run in runs)
        seconds = [
            statistics.median(run["points"][i]["seconds"] for run in runs)
            for i in range(epochs)
        ]
        accuracy = [
            statistics.median(run["points"][i]["accuracy"] for run in runs)
            for i in range(epochs)
        ]
        axes.plot(
            seconds,
            [100 * a for a in accuracy],
            marker="o",
            markersize=2,
            label=name,
        )
    axes.set_xlabel("wall seconds since launch")
    axes.set_ylabel("test accuracy (%)")
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path)
    pyplot.close(figure)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--suite", choices=sorted(SUITES), default="cifar10")
    parser.add_argument("--contenders", help="Default: the suite's.")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--first_seed", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--targets", help="Accuracies, e.g. 0.6,0.7,0.75.")
    parser.add_argument(
        "--plot",
        help="PNG path (default: the suite's figure in bench/; with "
        "--results, no plot unless given).",
    )
    parser.add_argument(
        "--work_dir", help="Logs, log_roots and results.json (default: tmp)."
    )
    parser.add_argument(
        "--dry_run", action="store_true", help="Print the commands only."
    )
    parser.add_argument(
        "--results",
        help="Comma-separated results.json files of earlier invocations "
        "(same suite and epochs): print their joint table (and plot, "
        "with --plot), run nothing.",
    )
    args = parser.parse_args()
    suite = SUITES[args.suite]
    args.contenders = [
        Contender(name)
        for name in (args.contenders or suite["contenders"]).split(",")
    ]
    args.targets = [
        float(t) for t in (args.targets or suite["targets"]).split(",")
    ]
    return args


def plan_runs(args, work_dir):
    """`(seed, contender, command, run_dir)` of every run, in run order.

    Built before anything runs, so a contender that cannot run stops the
    benchmark before the first training instead of after it.
    """
    suite = SUITES[args.suite]
    runs = []
    for index in range(args.seeds):
        seed = args.first_seed + index
        shift = index % len(args.contenders)
        for contender in args.contenders[shift:] + args.contenders[:shift]:
            run_dir = os.path.join(
                work_dir, f"{contender.name.replace(':', '_')}_seed{seed}"
            )
            if contender.framework == "ours":
                command = ours_command(
                    contender, suite, args.epochs, seed, run_dir
                )
            else:
                command = torch_command(contender, suite, args.epochs, seed)
            runs.append((seed, contender, command, run_dir))
    return runs


def main():
    args = parse_args()
    suite = SUITES[args.suite]
    if args.dry_run:
        for seed, contender, command, _ in plan_runs(args, "WORK_DIR"):
            print(f"-- {contender.name} seed {seed}: {' '.join(command)}")
        return
    if args.results:
        # The suite's figure stays the one of the run it documents.
        report(args, suite, *_load_results(args.results.split(",")))
        return
    args.plot = args.plot or suite["plot"]
    cpu = f"{common.cpu_model()}, {os.cpu_count()} cores"
    work_dir = args.work_dir or tempfile.mkdtemp(prefix="time_to_accuracy_")
    os.makedirs(work_dir, exist_ok=True)
    planned = plan_runs(args, work_dir)
    results = {contender.name: [] for contender in args.contenders}
    dtypes = {c.name: resolved_dtype(c) for c in args.contenders}
    print(f"== time to accuracy: {args.suite}, logs in {work_dir}", flush=True)
    for seed, contender, command, run_dir in planned:
        print(f"-- {contender.name} seed {seed}: {' '.join(command)}")
        sys.stdout.flush()
        log_path = run_dir + ".log"
        if contender.framework == "ours":
            if os.path.exists(run_dir):  # It would resume, not restart.
                raise SystemExit(f"{run_dir} exists; use a new --work_dir")
            points, seconds = run_ours(command, run_dir, log_path)
        else:
            points, seconds = run_torch(command, log_path)
        if not points:
            raise SystemExit(f"{contender.name}: no evaluation in {log_path}")
        results[contender.name].append(
            {
                "seed": seed,
                "dtype": dtypes[contender.name],
                "points": points,
                "seconds": seconds,
            }
        )
        save_results(work_dir, args, results, cpu)
    report(args, suite, results, cpu)
    print(f"raw curves: {work_dir}/results.json")


def report(args, suite, results, cpu):
    """The Markdown table of `results` (run on `cpu`), and the plot."""
    saved = bool(args.results)  # Loaded from results.json, not run now.
    print_table(results, args.targets, args.suite, args.epochs, cpu, saved)
    if args.plot:
        plot(
            results,
            args.plot,
            f"{args.suite} {suite['model']}, {args.epochs} epochs\n{cpu}",
        )
        print(f"\nplot: {args.plot}")


def _load_results(paths):
    """The runs of several results.json files, joined by contender.

    Returns:
      `(runs by contender, the CPUs they ran on as one string)`.
    """
    joined, cpus = {}, []
    for path in paths:
        with open(path) as stream:
            document = json.load(stream)
        cpu = document.get("cpu", "CPU not recorded")
        if cpu not in cpus:
            cpus.append(cpu)
        for name, runs in document["results"].items():
            joined.setdefault(name, []).extend(runs)
    return joined, " + ".join(cpus)


def save_results(work_dir, args, results, cpu):
    """The curves so far, rewritten after every run."""
    with open(os.path.join(work_dir, "results.json"), "w") as stream:
        json.dump(
            {
                "suite": args.suite,
                "epochs": args.epochs,
                "cpu": cpu,
                "knobs": {c.name: c.knobs for c in args.contenders},
                "results": results,
            },
            stream,
            indent=1,
        )


if __name__ == "__main__":
    main()
