"""The scaling bench's arithmetic: efficiency, predictions file, score.

Pure functions of `bench/scaling_score.py` and the report of
`bench/network_scaling.py` (`bench/network_report.py`) on a saved run made
up here; the bench itself
(root, network namespaces, minutes of jobs) is not run.
"""

import json
import os
import sys

import pytest

BENCH = os.path.join(os.path.dirname(os.path.dirname(__file__)), "bench")
sys.path.insert(0, BENCH)

import network_predict  # noqa: E402
import network_report  # noqa: E402
import scaling_score  # noqa: E402

from tf_resnet import scaling, traffic  # noqa: E402


def _row(name, ones, twos, threads=2, **flags):
    return {
        "name": name,
        "flags": {"distribution": "horovod", **flags},
        "script": "",
        "inter_op_threads": threads,
        "1": {"step_s": sorted(ones)[len(ones) // 2], "rounds": ones},
        "2": {"step_s": sorted(twos)[len(twos) // 2], "rounds": twos},
    }


def _asynchronous(row):
    return row["flags"]["distribution"] == "parameter_server"


def test_the_best_single_node_is_each_rounds_fastest_per_micro_batch():
    rows = [
        _row("two threads", [0.420, 0.410], [0.53, 0.54]),
        _row("one thread", [0.360, 0.400], [0.70, 0.72], threads=1),
        # Four micro-batches an update: 0.1 s each, the fastest per example.
        _row("accumulate 4", [0.400, 1.8], [0.45, 1.9], accumulate_steps=4),
        # Left out: not one node alone, whatever its step.
        _row("ps", [0.010, 0.010], [0.2, 0.2], distribution="parameter_server"),
    ]
    best = scaling_score.best_single_node(rows, _asynchronous)
    assert best == [(0.1, "accumulate 4"), (0.400, "one thread")]


def test_efficiency_is_against_the_best_single_node_not_the_rows_own():
    fast = _row("one thread", [0.380], [0.70], threads=1)
    slow = _row("two threads", [0.422], [0.534])
    best = scaling_score.best_single_node([fast, slow], _asynchronous)
    assert scaling_score.efficiency(slow, best, False) == pytest.approx(
        [0.380 / 0.534]
    )
    # Its own 1-node step, slower, flatters it.
    assert scaling_score.own_efficiency(slow, False) == pytest.approx(
        [0.422 / 0.534]
    )
    # Accumulation: 4 micro-batches of two processes per 2-node update.
    acc = _row("acc", [1.6], [1.0], accumulate_steps=4)
    assert scaling_score.efficiency(acc, best, False) == pytest.approx(
        [4 * 0.380 / 1.0]
    )


def test_an_asynchronous_row_keeps_its_own_definition():
    ps = _row("ps", [0.5, 0.6], [0.4, 0.5], distribution="parameter_server")
    best = [(0.1, "x"), (0.1, "x")]
    expected = [0.5 / (2 * 0.4), 0.6 / (2 * 0.5)]
    assert scaling_score.efficiency(ps, best, True) == pytest.approx(expected)
    assert scaling_score.spread([0.7, 0.5, 0.6]) == (0.6, 0.5, 0.7)


def test_the_cpu_fit_recovers_its_per_call_and_per_byte_costs():
    samples = [(n, 0.002 + n * 3e-9) for n in (4096, 65536, 1e6, 4e6, 8e6)]
    fit = scaling_score.fit_cpu(samples)
    assert fit["per_call_s"] == pytest.approx(0.002, rel=1e-6)
    assert fit["per_byte_s"] == pytest.approx(3e-9, rel=1e-6)
    assert scaling_score.communication_cpu(fit, 1e6, 3) == pytest.approx(
        3 * 0.002 + 1e6 * 3e-9
    )


def _entry(round_, efficiency=0.7):
    return scaling_score.prediction_entry(
        "resnet20",
        round_,
        {"link_mbit": 1000.0},
        [{"row": "horovod", "two_nodes_s": 0.5, "efficiency": efficiency,
          "communication_cpu_s": 0.01, "one_node_s": 0.4,
          "against": "best single node"}],
    )  # fmt: skip


def test_a_predictions_file_reads_back_only_as_written(tmp_path):
    path = str(tmp_path / "run.predictions.json")
    assert path == scaling_score.predictions_path(str(tmp_path / "run.json"))
    entries = [_entry(0), _entry(1, 0.8)]
    scaling_score.write_predictions(path, entries)
    logged = [e["sha256"] for e in entries]
    assert scaling_score.read_predictions(path, logged) == entries
    # A prediction changed after it was written: its hash no longer holds.
    with open(path) as stream:
        saved = json.load(stream)
    saved["rounds"][1]["predictions"][0]["efficiency"] = 0.75
    with open(path, "w") as stream:
        json.dump(saved, stream)
    with pytest.raises(ValueError, match=r"round 2: its content does not"):
        scaling_score.read_predictions(path, logged)
    # Rehashed too: not a hash the run logged before its 2-node jobs.
    saved["rounds"][1] = _entry(1, 0.75)
    with open(path, "w") as stream:
        json.dump(saved, stream)
    with pytest.raises(ValueError, match="not one the run logged"):
        scaling_score.read_predictions(path, logged)


def test_the_score_counts_rows_within_five_points_by_their_median():
    predicted = {"a": [0.70, 0.70, 0.70], "b": [0.60, 0.60], "c": [0.5]}
    measured = {"a": [0.72, 0.60, 0.74], "b": [0.70, 0.68], "c": [0.5]}
    points, within, scored = scaling_score.score(predicted, measured)
    assert points["a"] == pytest.approx([2.0, -10.0, 4.0])
    assert points["b"] == pytest.approx([10.0, 8.0])
    assert (within, scored) == (2, 3)


def _saved_run(tmp_path):
    """A saved run of one row and its predictions file, as the bench writes."""
    n = 1_000_000
    sizes = [4096, 65536, n // 4, n]
    row = _row("horovod", [0.40, 0.42], [0.50, 0.60])
    entries = [_entry(0, 0.78), _entry(1, 0.70)]
    result = {
        "model": "resnet20",
        "batch_per_process": 128,
        "network": "10gbe",
        "cpu_step_s": 0.4,
        "slowdown": 40.0,
        "link_mbit": 250.0,
        "iperf3_mbit": 240.0,
        "gradient_bytes": n,
        "tensors": 65,
        "sweeps": {
            f"horovod {p}": {str(s): 0.001 + s / 3e7 for s in sizes}
            for p in (2, 4)
        },
        "sweep_cpu_s": {
            f"horovod {p}": {str(s): 0.0005 + s / 1e9 for s in sizes}
            for p in (2, 4)
        },
        "rows": [row],
        "prediction_sha256": [e["sha256"] for e in entries],
    }
    results = {"cpu": "a CPU", "date": "2026-11-28", "models": [result]}
    out = tmp_path / "run.json"
    out.write_text(json.dumps(results))
    scaling_score.write_predictions(
        scaling_score.predictions_path(str(out)), entries
    )
    return str(out)


def test_the_report_scores_the_saved_predictions_against_the_best_node(
    tmp_path,
):
    out = _saved_run(tmp_path)
    text = network_report.report(*network_report.load_report(out))
    # One row, so its own 1-node step is the best: 0.40/0.50, 0.42/0.60.
    assert "| horovod | 2 | 420 | 500, 600 | 80%, 70% | **75%** (70-80%)" in (
        text
    )
    # Predicted 78% and 70%, measured 80% and 70%: +2 and 0 points.
    assert "| 78%, 70% | 80%, 70% | +2.0, +0.0 | +1.0 |" in text
    assert "Within ±5 points (a row by its median over rounds): 1 of 1" in text


def test_the_report_refuses_predictions_changed_after_the_run(tmp_path):
    out = _saved_run(tmp_path)
    path = scaling_score.predictions_path(out)
    with open(path) as stream:
        saved = json.load(stream)
    saved["rounds"][0]["predictions"][0]["efficiency"] = 0.80
    with open(path, "w") as stream:
        json.dump(saved, stream)
    with pytest.raises(SystemExit, match="run.predictions.json"):
        network_report.load_report(out)


def _calibration(alone, metrics=0.010):
    """A calibration of the horovod transport: sweeps, CPU, a step alone."""
    return {
        "bucket_bytes": 2**20,
        "state_bytes": 8 * 2**20,
        "inter_op_threads": 1,
        "sweeps": {"horovod 2": {"4096": metrics, str(8 * 2**20): 0.400}},
        "sweep_cpu_s": {"horovod 2": {}},
        "step_all_reduces_s": {"horovod": alone},
    }


# Four 1 MiB tensors, the last layer's ready first; 1 MiB buckets take two
# each (a bucket closes past its size), the first ready halfway through.
GRADIENTS = traffic.Gradients((2**20,) * 4, (1.0, 0.75, 0.5, 0.25))
NO_CPU = {"per_call_s": 0.0, "per_byte_s": 0.0}


def _predict(result, **flags):
    row = {"name": "r", "flags": {"distribution": "horovod", **flags}}
    return network_predict.predict_row(result, row, 0.300, GRADIENTS)


def test_one_all_reduce_after_the_step_adds_its_time_alone():
    result = _calibration(alone=0.250)
    step, cpu = _predict(result, overlap_all_reduce=False)
    assert (step, cpu) == (pytest.approx(0.300 + 0.250), 0.0)


def test_horovods_cycles_fuse_the_buckets_and_each_pays_its_call(
    monkeypatch,
):
    # A call costs 10 ms, a MiB 50 ms: the step's two 2 MiB buckets,
    # fused into one all-reduce when both are ready at once, take 210 ms.
    fit = scaling.RingFit(0.010, 0.0, 2**20 / 0.050)
    monkeypatch.setattr(network_predict, "fits_of", lambda r: {
        "horovod": fit})  # fmt: skip
    monkeypatch.setattr(network_predict, "cpu_fits_of", lambda r: {
        "horovod": NO_CPU})  # fmt: skip
    step, _ = _predict(_calibration(alone=0.210 + 0.010))
    # The backward pass is 200 ms. The first bucket is ready at 100 ms and
    # goes alone (110 ms alone), at 2/3 of its speed until 200 ms: through
    # at 243 ms; the second, ready at 200 ms, waits for it: 353 ms. Then
    # the metrics.
    first = 0.100 + 0.100 + (0.110 - 0.100 * network_predict.BUSY_CORE_SHARE)
    assert step == pytest.approx(0.300 + first + 0.110 - 0.200 + 0.010)
    # Timed alone twice as long: each all-reduce twice the fit's.
    slow, _ = _predict(_calibration(alone=0.420 + 0.010))
    first = 0.100 + 0.100 + (0.220 - 0.100 * network_predict.BUSY_CORE_SHARE)
    assert slow == pytest.approx(0.300 + first + 0.220 - 0.200 + 0.010)
    # Accumulating 4, the last micro-batch's backward pass (50 ms) hides
    # less: the first bucket goes at 25 ms, at 2/3 until 50 ms.
    step, _ = _predict(_calibration(alone=0.220), accumulate_steps=4)
    first = 0.025 + 0.025 + (0.110 - 0.025 * network_predict.BUSY_CORE_SHARE)
    assert step == pytest.approx(0.300 + first + 0.110 - 0.050 + 0.010)


def test_the_delayers_holding_slows_a_node_while_it_computes():
    flags = {"distribution": "horovod"}
    result = _calibration(alone=0.250)
    result["gradient_bytes"] = 8 * 2**20
    # No latency added, no delayers: nothing.
    assert network_predict.holding_seconds(result, flags, 0.5, 0.3) == 0.5
    # Both delayers take 4% of a core idle and 10 ms a MiB: a 0.5 s step
    # sending 8 MiB costs them 20 + 80 ms, a node half of it, of which
    # what lands in the 0.3 s it computes (3/5) slows it.
    result["holding"] = {
        "horovod": {"idle_cpu_per_s": 0.04, "cpu_per_byte": 0.010 / 2**20}
    }
    two = network_predict.holding_seconds(result, flags, 0.5, 0.3)
    assert two == pytest.approx(0.5 + 0.100 / 2 * 3 / 5)
    # averaging every 4 sends its state (8 MiB) once in four steps.
    averaging = {"distribution": "averaging", "average_every": 4}
    two = network_predict.holding_seconds(result, averaging, 0.5, 0.3)
    assert two == pytest.approx(0.5 + 0.040 / 2 * 3 / 5)


def test_averaging_pays_its_state_every_period_and_its_metrics_each_step():
    result = _calibration(alone=0.250)
    step, _ = network_predict.predict_row(
        result,
        {"name": "a", "flags": {"distribution": "averaging",
                                "average_every": 4}},
        0.300, GRADIENTS,
    )  # fmt: skip
    assert step == pytest.approx(0.300 + 0.010 + 0.400 / 4)


def test_rows_that_send_otherwise_than_the_calibration_use_the_ring_fit():
    def basis(**flags):
        row = {"flags": {"distribution": "horovod", **flags}}
        return network_predict.basis_of(row)

    assert basis() == "step"
    assert basis(overlap_all_reduce=False) == "step"
    assert basis(all_reduce_pack_bytes=2**22) == "ring fit"
    assert basis(accumulate_steps=4) == "step"
    assert basis(all_reduce_pack_bytes=2**22, accumulate_steps=4) == (
        "ring fit"
    )


def test_the_report_gives_the_holding_measured_and_the_probe_predicted():
    result = {
        "rows": [{"name": "horovod",
                  "2": {"holding_cpu_s": [1.0, 2.0], "wall_s": [50.0, 50.0]}}],
        "holding": {"horovod": {"idle_cpu_per_s": 0.02,
                                "cpu_per_byte": 0.005 / 2**20}},
    }  # fmt: skip
    text = " ".join(network_report.report_holding(result, cores=2))
    assert "horovod 1.0%, 2.0%." in text
    assert "horovod 2.0% of a core idle and 5.00 ms a MiB" in text
    # Without added latency, nothing.
    assert network_report.report_holding({"rows": [{"2": {}}]}, 2) == []
