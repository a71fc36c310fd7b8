"""`tf_resnet.launch.horovod`: local Horovod ranks, loopback-only namespace.

`horovodrun` 0.28.1 serves its rendezvous on `0.0.0.0` for the whole run.
Here the ranks are a tiny script without TensorFlow that reports what it
sees; the training tests (engine_runs.py) run through the same launcher.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tests.helpers import ROOT, listening_ports, requires_horovod
from tf_resnet.launch import horovod

# Reports its interfaces, pid and rendezvous port, then waits for the test
# to create the file named by its argument.
PROBE = """
import json, os, socket, sys, time
print("PROBE " + json.dumps({
    "rank": int(os.environ["HOROVOD_RANK"]),
    "pid": os.getpid(),
    "interfaces": [name for _, name in socket.if_nameindex()],
    "port": int(os.environ["HOROVOD_GLOO_RENDEZVOUS_PORT"]),
}), flush=True)
deadline = time.monotonic() + 60
while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:
    time.sleep(0.1)
"""


def _wait_for_probes(process, output, count, timeout=90):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = output.read_text()
        probes = [json.loads(p) for p in re.findall(r"PROBE (\{.*\})", text)]
        if len(probes) == count:
            return sorted(probes, key=lambda probe: probe["rank"])
        if process.poll() is not None:
            break
        time.sleep(0.2)
    pytest.fail(f"the ranks did not report:\n{output.read_text()[-3000:]}")


def _net_namespace(pid):
    return os.readlink(f"/proc/{pid}/ns/net")


@requires_horovod
@pytest.mark.parametrize("network", ["private", "host"])
def test_rendezvous_listens_only_inside_the_private_namespace(
    tmp_path, network
):
    probe, release = tmp_path / "probe.py", tmp_path / "release"
    probe.write_text(PROBE)
    output = tmp_path / "output.txt"
    command = [
        sys.executable, "-m", "tf_resnet.launch.horovod",
        "--np=2", f"--network={network}", f"--main={probe}", "--",
        str(release),
    ]  # fmt: skip
    with open(output, "w") as stream:
        process = subprocess.Popen(
            command, cwd=ROOT, stdout=stream, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    try:
        ranks = _wait_for_probes(process, output, 2)
        # The launcher runs horovodrun, which serves the rendezvous.
        children = f"/proc/{process.pid}/task/{process.pid}/children"
        with open(children) as stream:
            (child,) = stream.read().split()
        with open(f"/proc/{child}/cmdline", "rb") as stream:
            assert b"horovodrun" in stream.read()
        port = ranks[0]["port"]
        assert [rank["port"] for rank in ranks] == [port, port]
        inside = [listening_ports(rank["pid"]) for rank in ranks]
        ours = listening_ports()
        namespaces = {_net_namespace(rank["pid"]) for rank in ranks}
        release.touch()
        code = process.wait(60)
    finally:
        release.touch()
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert code == 0, output.read_text()[-3000:]
    assert all(port in ports for ports in inside)
    if network == "private":
        assert "private network namespace" in output.read_text()
        assert [rank["interfaces"] for rank in ranks] == [["lo"], ["lo"]]
        assert port not in ours
        assert len(namespaces) == 1
        assert namespaces != {_net_namespace("self")}
    else:  # The check above would see an open port.
        assert port in ours
        assert namespaces == {_net_namespace("self")}


def test_horovodrun_command_line():
    assert horovod.horovodrun_command(3, ["python", "x.py", "-a"]) == [
        "horovodrun", "-np", "3", "-H", "localhost:3", "--gloo",
        "--network-interface", "lo", "python", "x.py", "-a",
    ]  # fmt: skip
    args = horovod.parse_args(
        ["--np=2", "--", "--distribution=horovod", "--np=5"]
    )
    assert (args.np, args.network) == (2, "private")
    assert args.main == os.path.join(ROOT, "resnet_main.py")
    assert args.main_flags == ["--distribution=horovod", "--np=5"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--", "--distribution=horovod"], "required: --np"),
        (["--np=2", "--distribution=horovod"], "no --"),
        (["--np=0", "--"], "--np must be at least 1"),
        (["--np=2", "--main=missing.py", "--"], "missing.py is not a file"),
    ],
)
def test_flag_errors_are_one_line(capsys, argv, message):
    with pytest.raises(SystemExit) as error:
        horovod.parse_args(argv)
    assert error.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and message in lines[0], lines
    assert lines[0].startswith("launch.horovod: error:")


TRACEBACK = """RuntimeError: Horovod detected that one or more processes \
exited with non-zero status, thus causing the job to be terminated. The first \
process to do so was:
Process name: {rank}
Exit code: {code}
"""
LOST = (
    "resnet_main: error: lost a task of the training cluster after step 9 "
    "(Horovod has been shut down; waiting on rank {peer} on vm); ..."
)


@pytest.mark.parametrize(
    "said, rank, code, expected",
    [
        # A lost peer: the lowest rank's line, whichever rank failed first.
        ({1: LOST.format(peer=0), 0: LOST.format(peer=1)}, 1, 4,
         (LOST.format(peer=1), 4)),
        # A rank's own end: its line and code.
        ({0: "resnet_main: stopped: SIGTERM at step 3: ..."}, 0, 143,
         ("resnet_main: stopped: SIGTERM at step 3: ...", 143)),
        ({}, 1, 2, (None, 2)),
    ],
)  # fmt: skip
def test_the_failed_ranks_line_is_said_last(said, rank, code, expected):
    traceback = TRACEBACK.format(rank=rank, code=code)
    assert horovod.last_words(said, traceback, 1, "runs/x") == expected


def test_a_rank_killed_without_a_word_is_a_lost_peer(tmp_path):
    (tmp_path / "checkpoint").write_text('model_checkpoint_path: "ckpt-30"\n')
    traceback = TRACEBACK.format(rank=1, code=137)
    line, code = horovod.last_words({}, traceback, 1, str(tmp_path))
    assert code == 4
    assert line == (
        "resnet_main: error: lost a task of the training cluster (rank 1 "
        "ended with code 137 (SIGKILL); waiting on rank 1); the newest "
        f"complete checkpoint is {tmp_path}/ckpt-30, which the same command "
        "resumes from (exit code 4: a Slurm job of scripts/ requeues itself)"
    )
    # horovodrun failed without naming a rank: its own code, no line.
    assert horovod.last_words({}, "OSError: ...", 1, "x") == (None, 1)


MPIRUN_FAILED = """mpirun detected that one or more processes exited with \
non-zero status, thus causing
the job to be terminated. The first process to do so was:

  Process name: [[19296,1],{rank}]
  Exit code:    {code}
"""
MPIRUN_LOST_NODE = """ORTE has lost communication with a remote daemon.

  HNP daemon   : [[19296,0],0] on node node1
  Remote daemon: [[19296,0],1] on node 10.78.0.2

This is usually due to either a failure of the TCP network
"""


def test_mpiruns_failed_rank_and_lost_node_are_read(tmp_path):
    said = {1: "resnet_main: error: bad data"}
    assert horovod.last_words(
        said, MPIRUN_FAILED.format(rank=1, code=2), 2, "x"
    ) == ("resnet_main: error: bad data", 2)
    (tmp_path / "checkpoint").write_text('model_checkpoint_path: "ckpt-30"\n')
    line, code = horovod.last_words(
        {}, MPIRUN_LOST_NODE, 205, str(tmp_path), 31
    )
    assert code == 4
    assert line == (
        "resnet_main: error: lost a task of the training cluster after step "
        "31 (mpirun lost its daemon on 10.78.0.2: cut off or down; waiting "
        "on the ranks on 10.78.0.2); the newest complete checkpoint is "
        f"{tmp_path}/ckpt-30, which the same command resumes from (exit code "
        "4: a Slurm job of scripts/ requeues itself)"
    )
    # A rank killed, named or not: the peers it left lost it.
    signaled = (
        "mpirun noticed that process rank 1 with PID 77 on node node2 exited "
        "on signal 9 (Killed)."
    )
    line, code = horovod.last_words({}, signaled, 137, str(tmp_path))
    assert code == 4 and "(rank 1 ended with code 137 (SIGKILL); " in line
    assert "waiting on rank 1 on node2)" in line
    line, code = horovod.last_words({}, "Primary job terminated", 137, "x")
    assert code == 4 and "(a rank ended with code 137 (SIGKILL); " in line


def test_mpirun_command_line_bounds_a_cut_off_node():
    environ = {"PATH": "/bin", "TF_CPP_MIN_LOG_LEVEL": "2", "HOME": "/root"}
    command = horovod.mpirun_command(
        2, ["python", "x.py"], "a:1,b:1", "eth0", 20.0, environ=environ
    )
    assert command == [
        "mpirun", "-np", "2", "-H", "a:1,b:1", "-bind-to", "none", "-map-by",
        "slot", "--tag-output", "-x", "PATH", "-x", "TF_CPP_MIN_LOG_LEVEL",
        "-mca", "btl_tcp_if_include", "eth0", "-mca", "oob_tcp_if_include",
        "eth0", "-mca", "oob_tcp_keepalive_time", "4", "-mca",
        "oob_tcp_keepalive_intvl", "1", "-mca", "oob_tcp_keepalive_probes",
        "6", "python", "x.py",
    ]  # fmt: skip
    # Lost within half the bound at most (idle time, then the probes).
    for bound in (6.0, 20.0, 300.0, 1800.0):
        options = horovod.keepalive_options(bound)
        idle, interval, probes = (int(options[i]) for i in (2, 5, 8))
        assert idle + interval * probes <= bound / 2, (bound, options)
    # A keepalive the environment sets is the user's: none added.
    environ["OMPI_MCA_oob_tcp_keepalive_time"] = "100"
    command = horovod.mpirun_command(
        2, ["x"], None, None, 20.0, environ=environ
    )
    assert "oob_tcp_keepalive_time" not in command
    assert command[4] == "localhost:2"


def test_hosts_need_the_hosts_network(capsys):
    with pytest.raises(SystemExit):
        horovod.parse_args(["--np=2", "--hosts=a:1,b:1", "--"])
    assert "pass --network=host" in capsys.readouterr().err
    args = horovod.parse_args(
        ["--np=2", "--hosts=a:1,b:1", "--network=host", "--launcher=mpirun",
         "--", "--peer_timeout_secs=20"]
    )  # fmt: skip
    assert (args.hosts, args.launcher) == ("a:1,b:1", "mpirun")


def test_missing_horovodrun_is_a_clear_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    assert horovod.main(["--np=2", "--"]) == 2
    assert "no horovodrun next to" in capsys.readouterr().err


@requires_horovod
def test_auto_distribution_sees_the_horovod_ranks(synthetic_cifar, tmp_path):
    """The design card's usage, no --distribution: one 2-rank run, not two."""
    proc = subprocess.run(
        [
            sys.executable, "-m", "tf_resnet.launch.horovod", "--np=2", "--",
            f"--train_data_path={synthetic_cifar['train']}",
            f"--eval_data_path={synthetic_cifar['eval']}",
            f"--log_root={tmp_path}", "--batch_size=16", "--train_steps=2",
            "--eval_batch_count=1", "--log_every_steps=1",
        ],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={k: v for k, v in os.environ.items()
             if k != "TF_CPP_MIN_LOG_LEVEL"},  # As a user types it.
    )  # fmt: skip
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    # As quiet as a single run: horovodrun's TensorFlow says no INFO.
    assert "oneDNN custom operations" not in output, output[:3000]
    assert "cpu_feature_guard" not in output, output[:3000]
    picked = re.findall(
        r"\[(\d)\]<stderr>:.*distribution horovod \(started as one of 2 "
        r"ranks \(HOROVOD_SIZE\)\)",
        output,
    )
    assert sorted(picked) == ["0", "1"], output[-3000:]
    assert "global batch 16 over 2 replica(s) (horovod)" in output
