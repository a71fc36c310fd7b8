"""Two nodes of one host for the partition tests: a link to cut.

Each node is a network, PID, UTS and mount namespace of its own (hostname
`node1`, `node2`, both in its /etc/hosts; the host's /proc, where the
other node's processes are named), joined by one veth pair, `eth0` on
both sides (10.78.0.1 and 10.78.0.2), with no other device but their
loopbacks: nothing a run opens
is reachable from outside, and `cut` (`ip link set eth0 down` on node2)
is a partition that neither side's processes are told of. Killing a
namespace's first process ends every process started in it, whatever
happens to the test.

`horovodrun` reaches node2 over `ssh`, which here is `tests/two_nodes.py
ssh`: it runs the command in that node's namespaces (a real ssh would need
a server and keys, and would drop the test's environment).
"""

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time

# Not tests.helpers': this module also runs as horovodrun's ssh, which
# must not wait for TensorFlow's import.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ADDRESSES = {"node1": "10.78.0.1", "node2": "10.78.0.2"}
TOOLS = all(shutil.which(tool) for tool in ("unshare", "nsenter", "ip"))
# The first process of each node: reaps what is left to it.
_INIT = """
import os, time
while True:
    try:
        os.wait()
    except ChildProcessError:
        time.sleep(0.5)
"""


def usable():
    """Why the nodes cannot be made here, or "" (root and the tools)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if not TOOLS:
        return "needs unshare, nsenter and ip (util-linux, iproute2)"
    return ""


class Nodes:
    """node1 and node2; `with Nodes() as nodes:` makes and removes them."""

    def __init__(self):
        self.holders = {}  # The `unshare` of each node.
        self.inits = {}  # Host pid of each namespace's first process.
        self.bin = tempfile.mkdtemp(prefix="tfr_nodes_")

    def __enter__(self):
        try:
            return self._make()
        except BaseException:
            self.__exit__()
            raise

    def _make(self):
        for node in ADDRESSES:
            holder = subprocess.Popen(
                ["unshare", "--net", "--pid", "--uts", "--mount", "--fork",
                 sys.executable, "-c", _INIT],
                start_new_session=True,
            )  # fmt: skip
            self.holders[node] = holder
            children = f"/proc/{holder.pid}/task/{holder.pid}/children"
            deadline = time.monotonic() + 10
            while not _read(children).split():
                assert time.monotonic() < deadline, "no namespace"
                time.sleep(0.05)
            self.inits[node] = int(_read(children).split()[0])
        # Node2's network by its host pid: node1's network namespace only.
        subprocess.run(
            ["nsenter", "-t", str(self.inits["node1"]), "-n", "ip", "link",
             "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns",
             str(self.inits["node2"])],
            check=True, timeout=60,
        )  # fmt: skip
        # Every node resolves the names of both (Gloo looks its own up).
        hosts = os.path.join(self.bin, "hosts")
        with open(hosts, "w") as stream:
            stream.write("127.0.0.1 localhost\n")
            stream.writelines(f"{a} {n}\n" for n, a in ADDRESSES.items())
        for node, address in ADDRESSES.items():
            self.run(node, ["sh", "-ec", f"hostname {node}; ip link set lo "
                            f"up; ip addr add {address}/24 dev eth0; ip link "
                            "set eth0 up; mount --bind $0 /etc/hosts",
                            hosts])  # fmt: skip
        # horovodrun's ssh: this module, by the name it calls.
        ssh = os.path.join(self.bin, "ssh")
        with open(ssh, "w") as stream:
            stream.write(
                f"#!/bin/sh\nexec {sys.executable} {__file__} ssh "
                f'{self.inits["node1"]} {self.inits["node2"]} "$@"\n'
            )
        os.chmod(ssh, 0o755)
        return self

    def __exit__(self, *exc):
        for node in self.holders:
            self.end(node)
        shutil.rmtree(self.bin, ignore_errors=True)

    def end(self, node):
        """Kills every process of `node`'s PID namespace: what a command
        started there, and what its ssh started on the other node."""
        holder = self.holders[node]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(holder.pid, 9)
        holder.wait()

    def enter(self, node):
        """The prefix that runs a command on `node`, in the repository."""
        return _enter(self.inits[node], ROOT)

    def env(self, **extra):
        """The environment of a command on a node: its ssh first on PATH."""
        return {
            **os.environ,
            "PATH": f"{self.bin}:{os.environ['PATH']}",
            "TF_CPP_MIN_LOG_LEVEL": "2",
            **extra,
        }

    def run(self, node, command):
        result = subprocess.run(
            [*_enter(self.inits[node], "/"), *command],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert result.returncode == 0, (command, result.stderr[-3000:])
        return result.stdout

    def cut(self):
        """The link goes down on node2's side: a partition, nothing reset."""
        self.run("node2", ["ip", "link", "set", "eth0", "down"])

    def mend(self):
        self.run("node2", ["ip", "link", "set", "eth0", "up"])


def _enter(init, directory):
    return [
        "nsenter", "-t", str(init), "-n", "-p", "-u", "-m",
        f"--wd={directory}",
    ]  # fmt: skip


def _read(path):
    try:
        with open(path) as stream:
            return stream.read()
    except OSError:
        return ""


def _ssh(inits, argv):
    """`ssh [-o OPTION]... HOST [-p PORT] [-i KEY] COMMAND`, as horovodrun
    calls it: COMMAND in HOST's namespaces (by name or address)."""
    args = list(argv)
    while args and args[0].startswith("-"):
        args = args[2:] if args[0] in ("-o", "-p", "-i") else args[1:]
    host, args = args[0], args[1:]
    while args and args[0] in ("-o", "-p", "-i"):
        args = args[2:]
    names = {**{a: n for n, a in ADDRESSES.items()}, **{n: n for n in inits}}
    init = inits[names[host]]
    command = " ".join(args)
    # Its network and hostname only: a PID namespace cannot enter a
    # sibling's, and the caller's is killed with its node all the same.
    os.execvp(
        "nsenter",
        ["nsenter", "-t", init, "-n", "-u", "-m", "sh", "-c", command],
    )


if __name__ == "__main__" and sys.argv[1] == "ssh":
    _ssh(dict(zip(ADDRESSES, sys.argv[2:4], strict=True)), sys.argv[4:])
