"""A two-node Ray cluster in private, for the Ray launcher's tests.

Two network namespaces joined by a veth pair (10.77.0.1, the head, and
10.77.0.2) and no other device but their loopbacks, so nothing the
cluster opens is reachable from outside and nothing it sends leaves.
Each namespace also has its own PID namespace: `ray stop --force` inside
sees only that node's processes, and killing the namespace's first
process ends every process Ray started there, whatever happens to the
test. One cluster at a time on this machine (`running`).
"""

import contextlib
import fcntl
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from tests.engine_runs import WORKER
from tests.helpers import ROOT, resnet8_flags

HAS_RAY = importlib.util.find_spec("ray") is not None
requires_ray = pytest.mark.skipif(
    not HAS_RAY,
    reason="Ray is not installed (requirements-latest.txt has it)",
)
HEAD, NODE = "10.77.0.1", "10.77.0.2"
PORT = 6379
# The first process of each node's PID namespace: it reaps the processes
# Ray leaves to it, so `ray stop` does not wait for zombies.
REAPER = """
import os, time
while True:
    try:
        os.wait()
    except ChildProcessError:
        time.sleep(0.5)
"""
NAMESPACE_TOOLS = all(shutil.which(tool) for tool in ("unshare", "nsenter"))


def ray_resnet8_flags(synthetic_cifar, log_root, *extra):
    return resnet8_flags(
        synthetic_cifar, log_root, "--dtype=float32", "--log_every_steps=5",
        *extra,
    )  # fmt: skip


class Cluster:
    """Two Ray nodes, each in its own network and PID namespace."""

    def __init__(self):
        # Short: Ray's socket paths live under it (108 characters at most).
        self.root = tempfile.mkdtemp(prefix="tfr_ray_")
        self.holders = []  # `unshare` of each node, its process group.
        self.inits = []  # Host pid of each namespace's first process.
        self.env = {
            **os.environ,
            "RAY_USAGE_STATS_ENABLED": "0",
            "TF_CPP_MIN_LOG_LEVEL": "2",
        }
        self.ray = os.path.join(os.path.dirname(sys.executable), "ray")

    def enter(self, node, pids=True):
        """The prefix running a command in the namespaces of `node` (0: head).

        `pids=False`: the network namespace only, where a command names
        processes by their host pids.
        """
        return [
            "nsenter", "-t", str(self.inits[node]), "-n",
            *(["-p", "-m"] if pids else []), f"--wd={ROOT}",
        ]  # fmt: skip

    def run(self, node, command, timeout=120, pids=True):
        result = subprocess.run(
            [*self.enter(node, pids), *command],
            env=self.env, capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
        assert result.returncode == 0, (command, result.stderr[-3000:])
        return result.stdout

    def start(self):
        for _ in range(2):
            holder = subprocess.Popen(
                ["unshare", "--net", "--pid", "--fork", "--mount-proc",
                 sys.executable, "-c", REAPER],
                start_new_session=True,
            )  # fmt: skip
            self.holders.append(holder)
            children = f"/proc/{holder.pid}/task/{holder.pid}/children"
            deadline = time.monotonic() + 10
            while not read(children).split():
                assert time.monotonic() < deadline, "no namespace"
                time.sleep(0.05)
            self.inits.append(int(read(children).split()[0]))
        self.run(0, ["ip", "link", "add", "veth0", "type", "veth", "peer",
                     "name", "veth1", "netns", str(self.inits[1])],
                 pids=False)  # fmt: skip
        for node, (device, address) in enumerate(
            [("veth0", HEAD), ("veth1", NODE)]
        ):
            self.run(node, ["sh", "-ec", f"ip link set lo up; "
                            f"ip addr add {address}/24 dev {device}; "
                            f"ip link set {device} up"])  # fmt: skip
        common = [
            "--num-cpus=2", "--num-gpus=0", "--object-store-memory=100000000",
            "--disable-usage-stats",
        ]  # fmt: skip
        self.run(0, [self.ray, "start", "--head", f"--port={PORT}",
                     f"--node-ip-address={HEAD}",
                     f"--temp-dir={self.root}/head", *common])  # fmt: skip
        self.run(1, [self.ray, "start", f"--address={HEAD}:{PORT}",
                     f"--node-ip-address={NODE}",
                     f"--temp-dir={self.root}/node", *common])  # fmt: skip

    def stop(self):
        """Stops every Ray process of the cluster, then its namespaces."""
        for node in reversed(range(len(self.inits))):
            with contextlib.suppress(Exception):
                subprocess.run(
                    [*self.enter(node), self.ray, "stop", "--force"],
                    env=self.env, capture_output=True, timeout=60,
                )  # fmt: skip
        for holder in self.holders:
            # The namespace's first process gone, the kernel kills the rest.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(holder.pid, signal.SIGKILL)
            holder.wait()
        shutil.rmtree(self.root, ignore_errors=True)

    def launch(self, flags, dump_dir, *launcher_flags):
        """Starts the launcher on the head: `(Popen, output path)`."""
        os.makedirs(dump_dir, exist_ok=True)
        output = os.path.join(dump_dir, "launcher.txt")
        command = [
            *self.enter(0), sys.executable, "-m", "tf_resnet.launch.ray",
            f"--address={HEAD}:{PORT}", "--num_workers=2",
            "--placement_strategy=SPREAD", f"--main={WORKER}",
            *launcher_flags, "--", f"--dump_dir={dump_dir}", *flags,
        ]  # fmt: skip
        with open(output, "w") as stream:
            process = subprocess.Popen(
                command, env=self.env, stdout=stream,
                stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        return process, output


@contextlib.contextmanager
def running():
    """A started `Cluster`, stopped after; skips where none can run.

    One Ray cluster at a time on this machine (a file lock): pytest-xdist
    may run two cluster tests in two workers, and two clusters' actors
    importing TensorFlow on 2 cores miss Ray's start-up timeouts.
    """
    if not HAS_RAY:
        pytest.skip("Ray is not installed (requirements-latest.txt has it)")
    if os.getuid() != 0 or not NAMESPACE_TOOLS:
        pytest.skip("the test cluster's namespaces need root, unshare, nsenter")
    lock_path = os.path.join(tempfile.gettempdir(), "tf_resnet_ray_test.lock")
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        cluster = Cluster()
        try:
            cluster.start()
            yield cluster
        finally:
            cluster.stop()


def read(path):
    """The text of `path`; "" when it is (already or not yet) gone."""
    gone = (FileNotFoundError, ProcessLookupError)
    with contextlib.suppress(*gone), open(path, errors="replace") as stream:
        return stream.read()
    return ""
