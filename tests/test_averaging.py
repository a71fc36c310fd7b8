"""`--distribution=averaging` (local SGD) on two real processes.

Each equivalence test runs on both engines: two Horovod ranks
(`tf_resnet.launch.horovod`) and two workers of a TF_CONFIG cluster
(`tf_resnet.launch.tf_config_cluster`, TensorFlow's collectives), each launcher
in a loopback-only network namespace. Both run on the pinned set only
(`on_one_set`; Horovod is there alone); on the newest set, averaging on
multi_worker workers is the Ray cluster test's (`tests/test_ray.py`).

Each rank's step uses the learning rate of its own batch (8 of the global
16), so an averaging run at `--learning_rate=0.8` takes the same steps as a
synchronous run at 0.4 (see tf_resnet/distribute/averaging.py).
"""

import json

import numpy as np
import pytest

from tests import engine_runs
from tests.engine_runs import Spec
from tests.helpers import HAS_HOROVOD, on_one_set, requires_horovod
from tf_resnet import detect
from tf_resnet.config.settings import DistributionConfig
from tf_resnet.engines import registry
from tf_resnet.errors import UserInputError
from tf_resnet.runtime import distributor_for

ENGINES = pytest.mark.parametrize(
    "launcher",
    [
        pytest.param("horovod", marks=requires_horovod),
        pytest.param("tf_config_cluster", marks=[pytest.mark.slow, on_one_set]),
    ],
)
# The synchronous reference: Horovod's own mode on its ranks; for the
# workers, one process (which test_multi_worker shows equals them).
SYNCHRONOUS = {
    "horovod": Spec("horovod", ranks=2, learning_rate=0.4),
    "tf_config_cluster": Spec("default", learning_rate=0.4),
}


@ENGINES
def test_averaging_every_step_equals_synchronous_sgd(launcher):
    """N=1 with momentum 0.9 and weight decay: the mean of the ranks' updates
    is the update of the mean gradient (all of it is linear), and with the
    slots averaged too each rank also holds synchronous SGD's momentum."""
    sync, averaged = engine_runs.equivalence_runs(
        SYNCHRONOUS[launcher],
        Spec(
            "averaging",
            2,
            learning_rate=0.8,
            extra=("--average_every=1",),
            launcher=launcher,
        ),
    )
    assert "over 2 replica(s) (averaging)" in averaged.output
    for rank in (0, 1):
        engine_runs.assert_same_weights(
            averaged.weights(rank), sync.weights(), sync.weights(name="first")
        )
        slots = averaged.weights(rank, name="optimizer")
        expected = sync.weights(name="optimizer")
        assert len(slots) == len(expected) > 1
        assert slots[0] == expected[0]  # The step counter.
        # The momenta, to 1e-4 of the largest: the two runs sum in different
        # orders, so momenta near zero differ by more than 1e-4 of their own.
        scale = max(float(np.abs(e).max()) for e in expected[1:])
        assert scale > 1e-4
        for value, reference in zip(slots[1:], expected[1:], strict=True):
            np.testing.assert_allclose(value, reference, atol=1e-4 * scale)


@ENGINES
def test_averaging_once_at_the_end_is_the_mean_of_independent_runs(launcher):
    """N = all 6 steps: each rank trains alone on its shard, then the two
    models are averaged; compare with two single-process runs, one per shard
    file, at the per-rank batch of 8 (all read in file order)."""
    averaged, *alone = engine_runs.run_workers(
        (
            [
                *engine_runs.equivalence_flags(0.4, shuffle=False),
                "--distribution=averaging",
                f"--average_every={engine_runs.STEPS}",
            ],
            2,
            launcher,
        ),
        *[
            (
                engine_runs.equivalence_flags(
                    0.4, batch_size=8, train=f"shard{shard}", shuffle=False
                ),
                None,
            )
            for shard in (0, 1)
        ],
    )

    def mean_and_spread(name):
        first, second = (run.weights(name=name) for run in alone)
        pairs = [
            (a.astype(np.float64), b)
            for a, b in zip(first, second, strict=True)
        ]
        mean = [(a + b) / 2 for a, b in pairs]
        return mean, max(float(np.abs(a - b).max()) for a, b in pairs)

    mean, apart = mean_and_spread("weights")
    assert apart > 1e-2  # Before the average the ranks really differed.
    for rank in (0, 1):
        engine_runs.assert_same_weights(
            averaged.weights(rank), mean, alone[0].weights(name="first")
        )
    # The optimizer: step counter 6 everywhere, momentum slots averaged.
    slots, apart = mean_and_spread("optimizer")
    assert apart > 1e-4
    for rank in (0, 1):
        ours = averaged.weights(rank, name="optimizer")
        assert ours[0] == slots[0] == engine_runs.STEPS
        for value, expected in zip(ours, slots, strict=True):
            np.testing.assert_allclose(value, expected, rtol=1e-4, atol=1e-7)


@requires_horovod
def test_average_every_must_be_positive():
    with pytest.raises(UserInputError, match="--average_every must be"):
        distributor_for("averaging", 128, DistributionConfig(average_every=0))


def test_averaging_engine_follows_how_the_processes_were_started(
    monkeypatch,
):
    for name in ("HOROVOD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("TF_CONFIG", raising=False)
    config = DistributionConfig()
    assert registry.averaging_carrier(config)[0].name == "horovod"
    hosts = DistributionConfig(worker_hosts=("a:1", "b:2"))
    assert registry.averaging_carrier(hosts) == (
        registry.MULTI_WORKER,
        "--worker_hosts",
    )
    workers = {"cluster": {"worker": ["a:1", "b:2"]}, "task": {"index": 1}}
    monkeypatch.setenv("TF_CONFIG", json.dumps(workers))
    assert registry.averaging_carrier(config)[0].name == "multi_worker"
    monkeypatch.setenv("HOROVOD_SIZE", "2")  # horovodrun's ranks win.
    assert registry.averaging_carrier(config)[0].name == "horovod"


@pytest.mark.parametrize("devices", ["--num_gpus=4", "--cpu_replicas=4"])
def test_several_devices_in_one_process_name_the_launcher_to_run(
    monkeypatch, devices
):
    name = devices[2:].split("=")[0]
    argv = [
        "resnet_main.py", "--model=resnet20", devices,
        "--distribution=averaging", "--log_root=/tmp/my run",
    ]  # fmt: skip
    monkeypatch.setattr("sys.argv", argv)
    config = DistributionConfig(**{name: 4})
    with pytest.raises(UserInputError) as error:
        distributor_for("averaging", 128, config)
    message = str(error.value)
    assert "\n" not in message
    flags = (
        "-- --model=resnet20 --distribution=averaging '--log_root=/tmp/my run'"
    )
    launcher = "tf_resnet.launch.tf_config_cluster"
    python = detect.interpreter()  # The one running, not a bare `python`.
    assert f"{python} -m {launcher} --np=4 {flags}" in message
    if HAS_HOROVOD:
        assert f"{python} -m tf_resnet.launch.horovod --np=4 {flags}" in message
    assert devices not in message


def test_launcher_commands_keep_a_custom_main_and_add_the_mode():
    (command, *_) = registry.launcher_commands(
        2, ["tests/hvd_worker.py", "--num_gpus", "2", "--model=resnet8"]
    )
    assert command == (
        f"{detect.interpreter()} -m tf_resnet.launch.tf_config_cluster --np=2 "
        "--main=tests/hvd_worker.py -- --model=resnet8 "
        "--distribution=averaging"
    )
