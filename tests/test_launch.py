"""`tf_resnet.launch`: no TensorFlow, the shared process core, and the
flags for `--main` each launcher reads or adds.

The `run_peers` tests run it in a launcher process of its own (it installs
signal handlers) over small Python peers that report their pid and what
they received; no TensorFlow, so they take seconds.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from absl import flags

from tests.helpers import ROOT
from tf_resnet.config import flags as resnet_flags
from tf_resnet.launch import cli, horovod, ps, ray, tf_config_cluster


def _fresh_python(code):
    """Runs `code` in a new interpreter from ROOT; returns its JSON output."""
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(result.stdout)


def test_launchers_import_no_tensorflow_and_start_no_thread():
    report = """
import json, os, sys
before = set(sys.modules)
import tf_resnet.launch.horovod, tf_resnet.launch.ps
import tf_resnet.launch.tf_config_cluster
added = {name.split(".")[0] for name in set(sys.modules) - before}
print(json.dumps({
    "outside_stdlib": sorted(added - set(sys.stdlib_module_names)),
    "threads": len(os.listdir("/proc/self/task")),
}))
"""
    # One thread: the kernel refuses a user namespace to more. absl: the
    # flags for --main are read as the script reads them.
    assert _fresh_python(report) == {
        "outside_stdlib": ["absl", "tf_resnet"],
        "threads": 1,
    }
    # The check sees TensorFlow where it is imported.
    assert _fresh_python(
        report.replace(
            "tf_resnet.launch.ps", "tf_resnet.distribute.tf_strategy"
        )
    )["outside_stdlib"] != ["absl", "tf_resnet"]


UNPRIVILEGED = """
import json, os, sys, threading
sys.path.insert(0, sys.argv[1])
from tf_resnet.launch import private_network
if sys.argv[2] == "threaded":
    threading.Thread(target=threading.Event().wait, daemon=True).start()
try:
    private_network.enter_private_network()
except OSError as error:
    print(json.dumps({"error": str(error)}))
    sys.exit()
import socket
print(json.dumps({
    "interfaces": [name for _, name in socket.if_nameindex()],
    "uid": os.getuid(),
}))
"""


@pytest.mark.skipif(
    os.getuid() != 0 or not shutil.which("setpriv"),
    reason="becomes uid 65534 with setpriv, which needs root",
)
@pytest.mark.parametrize("threads", ["single", "threaded"])
def test_unprivileged_user_gets_a_namespace_only_single_threaded(threads):
    # The system Python: uid 65534 cannot read the venv under /root.
    python = shutil.which("python3", path="/usr/bin:/bin")
    result = subprocess.run(
        [
            "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
            python, "-I", "-c", UNPRIVILEGED, ROOT, threads,
        ],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    report = json.loads(result.stdout)
    if threads == "single":
        assert report == {"interfaces": ["lo"], "uid": 65534}
    else:
        assert "runs 2 threads" in report["error"]


PEER = """
import os, signal, sys, time
folder, name, action = sys.argv[1:4]
if action == "ignore_stop":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if action == "checkpoint_on_stop":
    def stop(signum, frame):
        open(os.path.join(folder, name + ".stopped"), "w").close()
        sys.exit(128 + signum)
    signal.signal(signal.SIGTERM, stop)
with open(os.path.join(folder, name + ".tmp"), "w") as stream:
    stream.write(str(os.getpid()))
os.rename(os.path.join(folder, name + ".tmp"), os.path.join(folder, name))
if action.startswith("exit"):
    time.sleep(0.5)
    sys.exit(int(action[4:]))
time.sleep(60)
"""

LAUNCHER = """
import json, sys
from tf_resnet.launch import cli, processes
peer, folder, actions, timeout = sys.argv[1:5]
commands = {
    name: ([sys.executable, peer, folder, name, action], None)
    for name, action in json.loads(actions).items()
}
sys.exit(processes.run_peers(commands, cli.logger("launcher"), float(timeout)))
"""


class Peers:
    """A `run_peers` launcher over PEER processes doing `actions`."""

    def __init__(self, tmp_path, actions, stop_timeout_secs=60):
        peer = tmp_path / "peer.py"
        peer.write_text(PEER)
        self.folder = tmp_path
        self.names = list(actions)
        self.process = subprocess.Popen(
            [
                sys.executable, "-c", LAUNCHER, str(peer), str(tmp_path),
                json.dumps(actions), str(stop_timeout_secs),
            ],
            cwd=ROOT, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip

    def pids(self):
        """Waits until every peer runs; returns their pids."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            paths = [self.folder / name for name in self.names]
            if all(path.exists() for path in paths):
                return [int(path.read_text()) for path in paths]
            time.sleep(0.05)
        pytest.fail("the peers did not start")

    def wait(self):
        """`(exit code, stderr)` of the launcher."""
        _, err = self.process.communicate(timeout=30)
        return self.process.returncode, err


def assert_gone(pids):
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        alive = [pid for pid in pids if os.path.exists(f"/proc/{pid}")]
        if not alive:
            return
        time.sleep(0.05)
    pytest.fail(f"peers outlived the launcher: {alive}")


def test_all_peers_succeed(tmp_path):
    peers = Peers(tmp_path, {"a": "exit0", "b": "exit0"})
    assert peers.wait()[0] == 0


def test_first_failure_stops_the_others_and_is_the_exit_code(tmp_path):
    peers = Peers(tmp_path, {"a": "run", "b": "exit3", "c": "run"})
    pids = peers.pids()
    start = time.monotonic()
    code, err = peers.wait()
    assert code == 3, err
    assert time.monotonic() - start < 10  # Not the peers' 60 s.
    assert "b exited with code 3; stopping the others" in err
    assert_gone(pids)


def test_a_stop_signal_is_forwarded_and_the_peers_exit_code_returned(
    tmp_path,
):
    actions = {"a": "checkpoint_on_stop", "b": "checkpoint_on_stop"}
    peers = Peers(tmp_path, actions)
    pids = peers.pids()
    peers.process.send_signal(signal.SIGTERM)
    code, err = peers.wait()
    assert code == 128 + signal.SIGTERM, err
    assert "SIGTERM: asking every process to stop" in err
    assert (tmp_path / "a.stopped").exists()
    assert (tmp_path / "b.stopped").exists()
    assert_gone(pids)


def test_peers_that_ignore_the_stop_are_killed_after_the_timeout(tmp_path):
    peers = Peers(
        tmp_path, {"a": "ignore_stop", "b": "ignore_stop"}, stop_timeout_secs=1
    )
    pids = peers.pids()
    peers.process.send_signal(signal.SIGTERM)
    code, err = peers.wait()
    assert code == 128 + signal.SIGKILL, err
    assert "killing every process" in err
    assert_gone(pids)


def test_peers_die_with_a_killed_launcher(tmp_path):
    peers = Peers(tmp_path, {"a": "run", "b": "run"})
    pids = peers.pids()
    peers.process.kill()
    peers.wait()
    assert_gone(pids)


# The flags for --main in each spelling absl takes; "flagfile": a
# --flagfile holding them (`given` writes it).
SPELLINGS = {
    "equals": lambda name, value: [f"--{name}={value}"],
    "one dash": lambda name, value: [f"-{name}={value}"],
    "apart": lambda name, value: [f"--{name}", value],
    "flagfile": None,
}


def given(spelling, tmp_path, distribution, log_root="/runs/a"):
    """`--distribution` and `--log_root` in `spelling`, a model after them."""
    values = {"distribution": distribution, "log_root": log_root}
    if spelling == "flagfile":
        path = tmp_path / "run.flags"
        path.write_text("".join(f"--{n}={v}\n" for n, v in values.items()))
        found = [f"--flagfile={path}"]
    else:
        spell = SPELLINGS[spelling]
        found = [part for n, v in values.items() for part in spell(n, v)]
    return [*found, "--model=resnet32"]


def trainer_reads(command):
    """`(--distribution, --log_root)` as resnet_main parses `command`."""
    values = flags.FlagValues()
    resnet_flags.define_all(values)
    main = command.index(os.path.join(ROOT, "resnet_main.py"))
    resnet_flags.parse(command[main:], flag_values=values)
    return values.distribution, values.log_root


def worker_commands(launcher, main_flags):
    """The command lines a launcher runs `--main` with, one per worker."""
    if launcher == "tf_config_cluster":
        args = tf_config_cluster.parse_args(["--np=2", "--", *main_flags])
        found = tf_config_cluster.worker_commands(
            args.main, args.main_flags, args.np
        )
        return [command for command, _ in found.values()]
    if launcher == "ray":
        args = ray.parse_args(["--num_workers=2", "--", *main_flags])
        return [ray.worker_command(args.main, args.main_flags)]
    args = horovod.parse_args(["--np=2", "--", *main_flags])
    command = [sys.executable, args.main, *args.main_flags]
    return [horovod.horovodrun_command(args.np, command)]


@pytest.mark.parametrize("spelling", SPELLINGS)
@pytest.mark.parametrize("launcher", ["tf_config_cluster", "ray", "horovod"])
def test_the_engine_given_reaches_every_worker(launcher, spelling, tmp_path):
    commands = worker_commands(launcher, given(spelling, tmp_path, "averaging"))
    assert [trainer_reads(c) for c in commands] == [
        ("averaging", "/runs/a")
    ] * len(commands)


@pytest.mark.parametrize("launcher", ["tf_config_cluster", "ray"])
def test_workers_are_told_their_engine_where_the_flags_leave_it(
    launcher, tmp_path
):
    for main_flags in ([], given("one dash", tmp_path, "auto")):
        commands = worker_commands(launcher, main_flags)
        assert {trainer_reads(c)[0] for c in commands} == {"multi_worker"}


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_the_launchers_read_the_log_root_given(spelling, tmp_path):
    main_flags = given(spelling, tmp_path, "multi_worker")
    advice = tf_config_cluster.resume_advice(main_flags)
    assert "checkpoint in --log_root=/runs/a (or" in advice(137)
    # Where Ray's launcher keeps its run files, and its messages.
    args = ray.parse_args(["--num_workers=2", "--", *main_flags])
    assert cli.given_flag(args.main_flags, "log_root") == "/runs/a"


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_the_ps_cluster_refuses_another_engine_in_any_spelling(
    spelling, tmp_path, capsys
):
    main_flags = given(spelling, tmp_path, "parameter_server")
    assert ps.parse_args(["--", *main_flags]).main_flags == main_flags
    with pytest.raises(SystemExit) as exit_:
        ps.parse_args(["--", *given(spelling, tmp_path, "averaging")])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == (
        "launch.ps: error: --distribution=averaging: this cluster runs "
        "parameter_server (see --help)\n"
    )


@pytest.mark.parametrize(
    "main_flags, message",
    [
        (["--flagfile=/no/such.flags"], "/no/such.flags"),
        (["-distribution=bogus"], "flag --distribution=bogus: value should"),
        (["--log_root"], "Missing value for flag --log_root"),
    ],
)
@pytest.mark.parametrize("launcher", [tf_config_cluster, ray, ps, horovod])
def test_unreadable_flags_for_main_are_one_line(
    launcher, main_flags, message, capsys
):
    own = {ps: [], ray: ["--num_workers=2"]}.get(launcher, ["--np=2"])
    with pytest.raises(SystemExit) as exit_:
        launcher.parse_args([*own, "--", *main_flags])
    assert exit_.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and message in lines[0], lines
    assert "error: in the flags after --: " in lines[0]
