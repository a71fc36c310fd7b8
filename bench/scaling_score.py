"""The arithmetic of `network_scaling.py`'s efficiency and its predictions.

Pure functions on the saved rows (the `--out` file's), so that the figures
the bench prints can be checked without running it.

Efficiency is what a user means by it: 2-node throughput over twice the
best 1-node throughput of the same run, not over the row's own 1-node
step. A row's 1-node step depends on its settings (two inter-op threads
on one core slow it down), and a user compares with running alone at the
best settings. The best is taken per round (the fastest 1-node job of that
round, per example, of any synchronous row: they share the per-process
batch), and a row is reported by the median over rounds with the spread.

Predictions are written to a file before the 2-node jobs they predict
start, each round's with a sha256 of its content, so that the score
(measured efficiency against predicted, in efficiency points) is of a
prediction, not of a fit to the data it is scored on.
"""

import datetime
import hashlib
import json
import statistics

# The target of a prediction: within this many efficiency points.
TARGET_POINTS = 5.0


def accumulate(row):
    """Micro-batches per update of a row (`--accumulate_steps`)."""
    return row["flags"].get("accumulate_steps", 1)


def rounds_of(row, key):
    """Each round's median step of a row's jobs on `key` ("1", "2")."""
    measured = row[key]
    return measured["rounds"] if "rounds" in measured else [measured["step_s"]]


def best_single_node(rows, asynchronous):
    """Each round's fastest 1-node step per micro-batch, and its row.

    Args:
      rows: the saved rows of one model (one per-process batch).
      asynchronous: `row -> bool`; those rows' 1-node jobs are left out
        (parameter_server's runs a ps and a coordinator beside its worker,
        unpinned on both cores: not one node alone).

    Returns:
      `[(seconds, row name), ...]`, one per round.
    """
    candidates = [row for row in rows if not asynchronous(row)]
    if not candidates:
        return []
    count = min(len(rounds_of(row, "1")) for row in candidates)
    best = []
    for i in range(count):
        step, name = min(
            (rounds_of(row, "1")[i] / accumulate(row), row["name"])
            for row in candidates
        )
        best.append((step, name))
    return best


def efficiency(row, best, asynchronous):
    """Each round's 2-node efficiency of a row.

    Synchronous: 2-node throughput (two processes, `accumulate` micro-
    batches per update) over twice the round's best 1-node throughput
    (`best`, seconds per micro-batch): `accumulate * best / 2-node step`.
    Asynchronous (parameter_server), its own definition: updates per
    second on 2 nodes over twice those of its own 1-node job (its 1-node
    job is not one node alone, see `best_single_node`).
    """
    ones, twos = rounds_of(row, "1"), rounds_of(row, "2")
    if asynchronous:
        return [o / (2 * t) for o, t in zip(ones, twos, strict=True)]
    return [
        accumulate(row) * b / t for (b, _), t in zip(best, twos, strict=False)
    ]


def own_efficiency(row, asynchronous):
    """Each round's 2-node throughput over twice the row's own 1-node one.

    Not what a user compares with: the row's 1-node step has the row's
    settings, the best or not.
    """
    half = 0.5 if asynchronous else 1.0
    return [
        half * o / t
        for o, t in zip(rounds_of(row, "1"), rounds_of(row, "2"), strict=True)
    ]


def spread(values):
    """`(median, min, max)` of a row's rounds."""
    return statistics.median(values), min(values), max(values)


def fit_cpu(samples):
    """CPU seconds of one all-reduce as `per_call + per_byte * nbytes`.

    `samples`: `[(nbytes, cpu seconds), ...]` of one transport's sweep
    on 2 processes. Least squares on relative errors, as `fit_ring`
    (the small messages set the per-call cost); neither term below 0.
    """
    import numpy as np

    sizes = np.array([n for n, _ in samples], dtype=float)
    cpu = np.array([max(c, 1e-9) for _, c in samples], dtype=float)
    rows = np.stack([np.ones_like(sizes), sizes], axis=1) / cpu[:, None]
    (per_call, per_byte), *_ = np.linalg.lstsq(rows, cpu / cpu, rcond=None)
    return {
        "per_call_s": max(0.0, float(per_call)),
        "per_byte_s": max(0.0, float(per_byte)),
    }


def communication_cpu(fit, nbytes, calls):
    """CPU seconds of `calls` all-reduces of `nbytes` in all, by `fit`."""
    return calls * fit["per_call_s"] + nbytes * fit["per_byte_s"]


def digest(content):
    """sha256 of a JSON-able value, keys sorted: what a round's hash is of."""
    text = json.dumps(content, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def predictions_path(out):
    """The predictions file beside an `--out` file."""
    stem = out[: -len(".json")] if out.endswith(".json") else out
    return stem + ".predictions.json"


def prediction_entry(model, round_, inputs, predictions):
    """One round's predictions, timed and hashed before its 2-node jobs."""
    content = {"inputs": inputs, "predictions": predictions}
    return {
        "model": model,
        "round": round_,
        "written": datetime.datetime.now(datetime.UTC).isoformat(
            timespec="seconds"
        ),
        "sha256": digest(content),
        **content,
    }


def write_predictions(path, entries):
    """Writes every round's entry so far; earlier ones are left as they were.

    Written to a temporary file and renamed: a crash leaves the last
    complete file.
    """
    import os

    with open(path + ".tmp", "w") as stream:
        json.dump({"rounds": entries}, stream, indent=1)
    os.replace(path + ".tmp", path)


def read_predictions(path, expected):
    """The entries of a predictions file, each checked against its hash.

    Args:
      path: the file.
      expected: the hashes the run logged (saved in the `--out` file), in
        order; each entry's must be among them.

    Raises:
      ValueError: naming the file and the entry whose content does not
        hash to what was written, or whose hash the run did not log.
    """
    with open(path) as stream:
        entries = json.load(stream)["rounds"]
    for entry in entries:
        where = f"{path}: {entry['model']}, round {entry['round'] + 1}"
        content = {k: entry[k] for k in ("inputs", "predictions")}
        if digest(content) != entry["sha256"]:
            raise ValueError(
                f"{where}: its content does not hash to its sha256"
            )
        if entry["sha256"] not in expected:
            raise ValueError(
                f"{where}: sha256 {entry['sha256'][:16]} is not one the run "
                "logged before its 2-node jobs"
            )
    return entries


def score(predicted, measured):
    """Per row: each round's measured less predicted efficiency, in points.

    Args:
      predicted: `{row name: [efficiency per round]}`.
      measured: the same, measured.

    Returns:
      `({row name: [points per round]}, rows within TARGET_POINTS by
      their median, rows scored)`.
    """
    points = {
        name: [
            100 * (m - p)
            for p, m in zip(predicted[name], measured[name], strict=False)
        ]
        for name in predicted
        if name in measured
    }
    within = sum(
        abs(statistics.median(p)) <= TARGET_POINTS for p in points.values()
    )
    return points, within, len(points)
