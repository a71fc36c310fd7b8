"""One device plan for every engine, checked as a table on any machine."""

import pytest

from tf_resnet import detect
from tf_resnet.engines import devices, startup
from tf_resnet.errors import UserInputError

Node = devices.Node


def gpus(count, ids=None):
    return tuple(ids or (str(i) for i in range(count)))


# (engine, num_gpus, node, server job) -> GPUs kept (TF's indices).
TABLE = [
    # 1 node x 4 GPUs, each engine.
    ("default", 0, Node(gpus(4)), None, ()),
    ("default", 1, Node(gpus(4)), None, (0,)),
    ("mirrored", 4, Node(gpus(4)), None, (0, 1, 2, 3)),
    ("auto", 2, Node(gpus(4)), None, (0, 1)),
    ("horovod", 0, Node(gpus(4), 2, 4, "horovodrun"), None, (2,)),
    ("averaging", 0, Node(gpus(4), 3, 4, "the launcher"), None, (3,)),
    ("multi_worker", 0, Node(gpus(4)), None, (0, 1, 2, 3)),
    ("multi_worker", 2, Node(gpus(4)), None, (0, 1)),
    ("multi_worker", 0, Node(gpus(4), 1, 4, "Slurm"), None, (1,)),
    ("parameter_server", 0, Node(gpus(4)), None, ()),  # The coordinator.
    ("parameter_server", 0, Node(gpus(4)), "ps", ()),
    ("parameter_server", 0, Node(gpus(4)), "worker", (0, 1, 2, 3)),
    ("parameter_server", 0, Node(gpus(4), 1, 2, "Slurm"), "worker", (1,)),
    # 2 nodes x 8 GPUs: rank 13 of 16 is local rank 5 on the second node.
    ("horovod", 0, Node(gpus(8), 5, 8, "horovodrun"), None, (5,)),
    ("multi_worker", 0, Node(gpus(8), 0, 1, "Slurm"), None, tuple(range(8))),
    ("multi_worker", 0, Node(gpus(8), 7, 8, "Slurm"), None, (7,)),
    # No GPU: the CPU under every engine.
    ("horovod", 0, Node(), None, ()),
    ("multi_worker", 0, Node((), 1, 4, "Slurm"), None, ()),
    ("mirrored", 0, Node(), None, ()),
]


@pytest.mark.parametrize("engine, num_gpus, node, job, kept", TABLE)
def test_each_engine_keeps_the_gpus_of_its_rule(
    engine, num_gpus, node, job, kept
):
    plan = devices.plan(startup.devices_rule(engine), num_gpus, 1, node, job)
    assert plan.gpus == kept
    assert plan.gpu_ids == tuple(node.gpu_ids[i] for i in kept)
    assert plan.replicas == max(len(kept), 1)
    assert plan.why


def test_multi_worker_keeps_the_gpus_it_was_given():
    """The bug this plan fixes: multi_worker used to hide every GPU."""
    plan = devices.plan(
        startup.devices_rule("multi_worker"), 0, 1, Node(gpus(2))
    )
    assert plan.device_names == ["/gpu:0", "/gpu:1"]


def test_cuda_visible_devices_renumbers(monkeypatch):
    for name in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    node = Node(detect.gpu_ids(2), 1, 2, "horovodrun")
    plan = devices.plan(startup.devices_rule("horovod"), 0, 1, node)
    assert (plan.gpus, plan.gpu_ids) == ((1,), ("5",))
    assert plan.describe() == "GPU 0 (CUDA 5)"
    assert plan.device_names == ["/gpu:0"]  # The one kept is /gpu:0.


def test_slurm_tells_the_local_rank_and_the_gpus(monkeypatch):
    for name in (
        "HOROVOD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "LOCAL_RANK",
        "CUDA_VISIBLE_DEVICES", "SLURM_JOB_GPUS", "PBS_NODEFILE",
    ):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLURM_LOCALID", "1")
    monkeypatch.setenv("SLURM_NODEID", "1")
    monkeypatch.setenv("SLURM_STEP_TASKS_PER_NODE", "4,2(x2)")
    monkeypatch.setenv("SLURM_STEP_GPUS", "6,7")
    assert detect.local_process() == (1, 2, "Slurm")
    assert detect.gpu_ids(2) == ("6", "7")
    monkeypatch.setenv("HOROVOD_LOCAL_RANK", "0")  # horovodrun's own wins.
    monkeypatch.setenv("HOROVOD_LOCAL_SIZE", "2")
    assert detect.local_process() == (0, 2, "horovodrun")


def test_pbs_node_file_gives_the_local_rank(monkeypatch, tmp_path):
    for name in (
        "HOROVOD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "LOCAL_RANK",
        "SLURM_LOCALID",
    ):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("a\na\nb\nb\nb\n")
    monkeypatch.setenv("PBS_NODEFILE", str(nodefile))
    assert detect.local_process(3) == (1, 3, "PBS_NODEFILE")
    assert detect.local_process(1) == (1, 2, "PBS_NODEFILE")


@pytest.mark.parametrize(
    "engine, num_gpus, node, message",
    [
        ("mirrored", 5, Node(gpus(4)), "--num_gpus=5 but 4 GPU(s) are visible"),
        ("default", 1, Node(), "--num_gpus=1 but 0 GPU(s) are visible"),
        (
            "horovod",
            0,
            Node(gpus(2), 3, 4, "horovodrun"),
            "4 processes on this node (horovodrun) but only 2 GPU(s)",
        ),
        (
            "multi_worker",
            0,
            Node(gpus(2), 0, 4, "Slurm"),
            "4 processes on this node (Slurm) but only 2 GPU(s)",
        ),
    ],
)
def test_asking_for_more_than_exists_is_one_clear_error(
    engine, num_gpus, node, message
):
    with pytest.raises(UserInputError) as error:
        devices.plan(startup.devices_rule(engine), num_gpus, 1, node)
    assert message in str(error.value)
    assert "\n" not in str(error.value)


def test_cpu_replicas_without_gpus():
    plan = devices.plan(startup.devices_rule("mirrored"), 0, 2, Node())
    assert plan.device_names == ["/cpu:0", "/cpu:1"]
    assert plan.describe() == "CPU as 2 logical devices"
