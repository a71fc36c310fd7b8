"""`tf_resnet.launch`: standard library only, and the shared process core.

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

from tests.helpers import ROOT


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


def test_launchers_import_only_the_standard_library_and_start_no_thread():
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
    # One thread: the kernel refuses a user namespace to more.
    assert _fresh_python(report) == {
        "outside_stdlib": ["tf_resnet"],
        "threads": 1,
    }
    # The check sees TensorFlow where it is imported.
    assert _fresh_python(
        report.replace(
            "tf_resnet.launch.ps", "tf_resnet.distribute.tf_strategy"
        )
    )["outside_stdlib"] != ["tf_resnet"]


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
