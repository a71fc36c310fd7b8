"""The scaling model: the ring fit, the engines' traffic, the projection.

Pure arithmetic on the model's own formulas, and the command a user runs.
The measurements it is fitted to and checked against are a benchmark
(`bench/network_scaling.py`), not a test.
"""

import subprocess
import sys

import pytest

from tests import helpers
from tf_resnet import scaling, traffic
from tf_resnet.engines import registry

MB = 1e6


def test_the_ring_fit_recovers_the_parameters_it_was_made_from():
    truth = scaling.RingFit(c=0.004, a=0.0002, bandwidth=90 * MB)
    samples = [
        (n, p, truth(n, p))
        for p in (2, 4)
        for n in (4096, 65536, 3 * MB, 12 * MB, 47 * MB)
    ]
    fit = scaling.fit_ring(samples)
    assert fit.c == pytest.approx(truth.c, rel=1e-6)
    assert fit.a == pytest.approx(truth.a, rel=1e-6)
    assert fit.bandwidth == pytest.approx(truth.bandwidth, rel=1e-6)


def test_a_ring_all_reduce_crosses_the_node_links_2_p_minus_1_over_p_times():
    link = traffic.Link(bandwidth=100 * MB, latency=0.0)
    fast = traffic.Link(bandwidth=1e15, latency=0.0)
    for nodes in (2, 4, 8):
        cluster = traffic.Cluster(nodes * 8, 8, link, fast)
        expected = 2 * (nodes - 1) / nodes * 50 * MB / link.bandwidth
        seconds = traffic.all_reduce_seconds(50 * MB, cluster)
        assert seconds == pytest.approx(expected, rel=1e-6)
    # Inside one node only its own links are used.
    one_node = traffic.Cluster(8, 8, link, fast)
    assert traffic.all_reduce_seconds(50 * MB, one_node) < 1e-6


def _cluster(gpus=2, gpus_per_node=1):
    link = traffic.Link(bandwidth=100 * MB, latency=1e-4)
    return traffic.Cluster(gpus, gpus_per_node, link, link)


def test_each_engines_traffic_on_two_nodes():
    n, compute, cluster = 40 * MB, 0.5, _cluster()
    # One tensor, ready when the backward pass ends: nothing to overlap.
    gradients = traffic.Gradients.at_end(n)
    ring = 2 * 1e-4 + n / (100 * MB)
    every_step = registry.ENGINES["horovod"].traffic
    for overlap in (True, False):
        assert every_step.exposed_seconds(
            gradients, compute, cluster, traffic.Knobs(overlap=overlap)
        ) == pytest.approx(ring)
    half = every_step.exposed_seconds(
        gradients, compute, cluster, traffic.Knobs(compression=0.5)
    )
    assert half == pytest.approx(2 * 1e-4 + n / 2 / (100 * MB))
    n = gradients
    averaging = registry.ENGINES["averaging"].traffic
    assert averaging.exposed_seconds(
        n, compute, cluster, traffic.Knobs(average_every=4)
    ) == pytest.approx((2 * 1e-4 + 2 * n.nbytes / (100 * MB)) / 4)
    push_pull = registry.ENGINES["parameter_server"].traffic
    assert push_pull.exposed_seconds(
        n, compute, cluster, traffic.Knobs()
    ) == pytest.approx(2 * n.nbytes / (100 * MB))
    # One ps for two workers: its link carries both.
    one_ps = traffic.Cluster(2, 1, cluster.network, cluster.node, ps_tasks=1)
    assert push_pull.exposed_seconds(
        n, compute, one_ps, traffic.Knobs()
    ) == pytest.approx(4 * n.nbytes / (100 * MB))
    # Packs after the backward pass: each pays the latency of its rounds.
    # They are the buckets' plan: whole tensors, one pack per tensor here,
    # and a tensor larger than a pack is not split.
    quarters = traffic.Gradients((n.nbytes / 4,) * 4, (1.0,) * 4)
    for gradients, packs in ((quarters, 4), (n, 1)):
        packed = every_step.exposed_seconds(
            gradients,
            compute,
            cluster,
            traffic.Knobs(pack_bytes=n.nbytes / 8, overlap=False),
        )
        assert packed == pytest.approx(ring + (packs - 1) * 2 * 1e-4)


def test_buckets_go_one_at_a_time_once_their_gradients_exist():
    """Four tensors of 10 MB; the last (first in the backward pass) ready
    after a tenth of it, then a third, two thirds, and at its end."""
    gradients = traffic.Gradients((10 * MB,) * 4, (1.0, 2 / 3, 1 / 3, 0.1))
    cluster = _cluster()
    every_step = registry.ENGINES["horovod"].traffic
    bucket = 2 * 1e-4 + 10 * MB / (100 * MB)  # 0.1002 s each.
    knobs = traffic.Knobs(pack_bytes=1)  # A bucket per tensor.

    def exposed(compute):
        return every_step.exposed_seconds(gradients, compute, cluster, knobs)

    # A long backward pass (1.5 s): each bucket waits for its gradients,
    # the last starts when the backward pass ends.
    assert exposed(2.25) == pytest.approx(bucket)
    # A short one (0.3 s): the link is the bottleneck, the buckets queue
    # from the first one's start at 0.03 s.
    assert exposed(0.45) == pytest.approx(0.03 + 4 * bucket - 0.3)
    # One all-reduce after the backward pass: all of it exposed.
    after = every_step.exposed_seconds(
        gradients, 0.45, cluster, traffic.Knobs(overlap=False)
    )
    assert after == pytest.approx(2 * 1e-4 + 40 * MB / (100 * MB))
    # Buckets of more than 15 MB: the first two tensors from the end, then
    # the other two; ready when their later gradient is.
    assert gradients.buckets(15 * MB) == [(20 * MB, 1 / 3), (20 * MB, 1.0)]


def test_a_models_gradients_appear_last_layer_first():
    gradients = scaling.gradients_of("resnet20")
    # The classifier's (the last variables) first, the stem's last.
    assert gradients.ready[-1] < 0.01 and gradients.ready[0] == 1.0
    # The later half of the variables, on the whole, before the earlier.
    half = len(gradients.ready) // 2
    assert max(gradients.ready[half:]) < min(gradients.ready[: half // 2])


def test_every_engine_that_spans_nodes_has_traffic_and_no_other():
    for engine in registry.ENGINES.values():
        spans_nodes = engine.launcher is not None
        assert (engine.traffic is not None) == spans_nodes, engine.name
        if engine.traffic is not None:
            assert engine.transport is not None, engine.name


def test_the_two_node_prediction_adds_what_the_traffic_exposes():
    fit = scaling.RingFit(c=0.005, a=1e-4, bandwidth=100 * MB)
    n = 40 * MB
    gradients = traffic.Gradients.at_end(n)
    horovod = registry.ENGINES["horovod"]
    plain = scaling.predict_two_nodes(
        horovod, traffic.Knobs(), 0.6, fit, gradients
    )
    # The fitted constant `c` is paid once per call.
    assert plain == pytest.approx(0.6 + fit(n, 2))
    fp16 = scaling.predict_two_nodes(
        horovod, traffic.Knobs(compression=0.5), 0.6, fit, gradients
    )
    assert fp16 == pytest.approx(0.6 + fit(n / 2, 2))
    # Two workers, one ps: each update waits for its pull and push over a
    # ps link both share; their updates interleave.
    ps = registry.ENGINES["parameter_server"]
    assert scaling.predict_two_nodes(
        ps, traffic.Knobs(), 1.0, fit, gradients
    ) == pytest.approx((1.0 + 4 * n / fit.bandwidth) / 2)


def test_efficiency_falls_with_cluster_size_and_rises_with_each_knob():
    step = scaling.GPU_STEPS["resnet50"]
    network = scaling.NETWORKS["25gbe"]
    horovod = registry.ENGINES["horovod"]
    n = traffic.Gradients.at_end(100 * MB)

    def efficiency(gpus, knobs=None, net=network):
        return scaling.project(step, n, gpus, 8, net, horovod, knobs).efficiency

    assert efficiency(8) > efficiency(64) > efficiency(512)
    assert efficiency(64, net=scaling.NETWORKS["10gbe"]) < efficiency(64)
    assert efficiency(64, net=scaling.NETWORKS["100ib"]) > efficiency(64)
    fp16 = traffic.Knobs(compression=0.5)
    assert efficiency(64, fp16) > efficiency(64)
    accumulate = traffic.Knobs(compression=0.5, accumulate_steps=4)
    assert efficiency(64, accumulate) > efficiency(64, fp16)
    assert 0 < efficiency(512) < efficiency(64, accumulate) <= 1


def test_the_pick_is_synchronous_and_keeps_the_batch_unless_asked():
    rows = scaling.projections(
        scaling.GPU_STEPS["resnet50"], traffic.Gradients.at_end(100 * MB),
        64, 8, scaling.NETWORKS["10gbe"],
    )  # fmt: skip
    for accumulate in (False, True):
        best = scaling.pick(rows, accumulate=accumulate)
        assert best.engine.name in ("horovod", "multi_worker")
        assert (best.knobs.accumulate_steps > 1) == accumulate
    same_batch = [
        r
        for r in rows
        if r.engine.name in ("horovod", "multi_worker")
        and r.knobs.accumulate_steps == 1
    ]
    # On 10 GbE at 64 GPUs no row of the same batch reaches 90% (with
    # gradients that all appear at the end, nothing overlaps): the best.
    assert max(r.efficiency for r in same_batch) < 0.9
    assert scaling.pick(rows) == max(same_batch, key=lambda r: r.efficiency)


def test_overlap_raises_the_projection_of_resnet50():
    step = scaling.GPU_STEPS["resnet50"]
    gradients = scaling.gradients_of("resnet50")
    network = scaling.NETWORKS["25gbe"]
    horovod = registry.ENGINES["horovod"]
    overlapped = scaling.project(step, gradients, 64, 8, network, horovod)
    after = scaling.project(
        step, gradients, 64, 8, network, horovod, traffic.Knobs(overlap=False)
    )
    assert after.efficiency < overlapped.efficiency <= 1


def test_resnet18_has_46_8_mb_of_gradients():
    # 11.69 M parameters at ImageNet's 1000 classes: 46.8 MB of float32.
    assert scaling.gradient_bytes("resnet18") / MB == pytest.approx(46.8, 0.01)


@helpers.on_one_set  # The model's command, not TensorFlow's.
def test_the_command_prints_every_engine_and_what_to_use():
    result = subprocess.run(
        [sys.executable, "-m", "tf_resnet.scaling", "--model=resnet20",
         "--gpus=16", "--network=10gbe"],
        capture_output=True, text=True, cwd=helpers.ROOT, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for engine in ("horovod", "multi_worker", "averaging", "parameter_server"):
        assert engine in out
    assert "16 GPUs in 2 node(s) of 8" in out
    assert "\nuse: " in out
    assert "\nwith a larger batch: " in out
    bad = subprocess.run(
        [sys.executable, "-m", "tf_resnet.scaling", "--gpus=0"],
        capture_output=True, text=True, cwd=helpers.ROOT, timeout=120,
    )  # fmt: skip
    assert bad.returncode == 2
    assert "--gpus" in bad.stderr.splitlines()[-1]
