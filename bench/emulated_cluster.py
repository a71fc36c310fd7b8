"""Nodes on an emulated network: namespaces, a bridge, rate-shaped links.

Each node is a network namespace with one interface, `eth0`, a veth pair
whose other end is on a bridge in a hub namespace, the stand-in for a
switch. Every node's link is shaped in both directions with a token
bucket (`tc qdisc ... tbf`), as a NIC of that rate on a full-duplex switch
port is: what a node sends leaves through its own `eth0`, what it receives
comes through the hub's end of its veth.

    hub     10.79.0.1    bridge br0
    nodeI   10.79.0.1I   eth0 (veth on br0), rate-shaped both ways

Latency is optional (`delay`). This kernel has no `netem` qdisc
(CONFIG_NET_SCH_NETEM is off), so a node's received packets are held in
user space instead (`link_delay.c`, through netfilter's queue): on the
receiving side, after the packets crossed the veth, so the sender's TCP
does not count them as its own queued bytes (it would throttle itself,
as it does under `netem` on the sending side). Without it, the links
have the latency the software stack has.

Nothing here routes anywhere else: the namespaces have only their own
addresses, so every byte stays on this machine. Needs root (`ip netns`).
"""

import contextlib
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import time

SUBNET = "10.79.0"
PREFIX = "tfrnet"  # Namespace names: tfrnet-hub, tfrnet-node0, ...
HUB = f"{PREFIX}-hub"
HUB_ADDRESS = f"{SUBNET}.1"
# What a node receives goes to netfilter queue 0, where `link_delay` holds
# it: the rule, added (-A) or deleted (-D) in this table.
QUEUE_TABLE = ["iptables-legacy", "-t", "mangle"]
QUEUE_RULE = ["PREROUTING", "-i", "eth0", "-j", "NFQUEUE", "--queue-num", "0"]
# What `delay` runs: the rule's command and the compiler of the delayer.
DELAY_PROGRAMS = (QUEUE_TABLE[0], os.environ.get("CC", "cc"))


def _ip(*args, check=True):
    return subprocess.run(
        ["ip", *args], check=check, capture_output=True, text=True
    )


def build_delayer():
    """The delayer (`link_delay.c`), compiled once per source into the cache.

    Returns its path.
    """
    source = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                          "link_delay.c")  # fmt: skip
    with open(source, "rb") as stream:
        digest = hashlib.sha256(stream.read()).hexdigest()[:12]
    cache = os.path.join(os.path.expanduser("~"), ".cache", "tf-resnet")
    binary = os.path.join(cache, f"link_delay-{digest}")
    if not os.path.exists(binary):
        os.makedirs(cache, exist_ok=True)
        partial = f"{binary}.{os.getpid()}"
        subprocess.run([DELAY_PROGRAMS[1], "-O2", "-Wall", "-o",
                        partial, source], check=True)  # fmt: skip
        os.replace(partial, binary)
    return binary


def missing_programs(delay=False):
    """The programs the emulated cluster needs that this machine lacks.

    With `delay`, also those of `delay` and `round_trip_ms` (ping).
    """
    needed = ("ip", "tc", "taskset")
    if delay:
        needed += (*DELAY_PROGRAMS, "ping")
    return [p for p in needed if not shutil.which(p)]


class EmulatedCluster:
    """`nodes` namespaces on a bridge, each link shaped to `rate_mbit`.

    Use as a context manager; `stop` removes every namespace and process.
    """

    def __init__(self, nodes, rate_mbit=None):
        self.nodes = nodes
        self.rate_mbit = rate_mbit
        self.processes = []
        self.delayers = []
        self.delay_ms = 0.0

    @staticmethod
    def namespace(node):
        return f"{PREFIX}-node{node}"

    @staticmethod
    def address(node):
        return f"{SUBNET}.{11 + node}"

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    def start(self):
        self.stop()  # What an interrupted run left.
        hub = HUB
        _ip("netns", "add", hub)
        _ip("-n", hub, "link", "set", "lo", "up")
        _ip("-n", hub, "link", "add", "br0", "type", "bridge")
        _ip("-n", hub, "addr", "add", f"{HUB_ADDRESS}/24", "dev", "br0")
        _ip("-n", hub, "link", "set", "br0", "up")
        for node in range(self.nodes):
            name = self.namespace(node)
            _ip("netns", "add", name)
            _ip("-n", name, "link", "set", "lo", "up")
            _ip(
                "-n", hub, "link", "add", f"to{node}", "type", "veth",
                "peer", "name", "eth0", "netns", name,
            )  # fmt: skip
            _ip("-n", hub, "link", "set", f"to{node}", "master", "br0", "up")
            _ip("-n", name, "addr", "add", f"{self.address(node)}/24",
                "dev", "eth0")  # fmt: skip
            _ip("-n", name, "link", "set", "eth0", "up")
            # This host's name means the node's own address inside it:
            # Gloo contexts that take no interface (Horovod's process
            # sets) resolve it (`ip netns exec` binds this over /etc/hosts).
            os.makedirs(f"/etc/netns/{name}", exist_ok=True)
            with open(f"/etc/netns/{name}/hosts", "w") as hosts:
                hosts.write(
                    f"127.0.0.1 localhost\n{self.address(node)} "
                    f"{socket.gethostname()}\n"
                )
        if self.rate_mbit:
            self.shape(self.rate_mbit)

    def shape(self, rate_mbit):
        """Shapes every node's link to `rate_mbit` in both directions.

        The bucket holds 4 ms of traffic, at least 16 KB (a few frames:
        tbf splits the 64 KB segments veth hands it): at slow rates a
        larger bucket would let a whole small message through at once.
        It queues up to 100 ms before dropping, like a switch port's
        buffer.
        """
        self.rate_mbit = rate_mbit
        burst = max(16_000, int(rate_mbit * 1e6 / 8 * 0.004))
        tbf = ["tbf", "rate", f"{rate_mbit}mbit", "burst", str(burst),
               "latency", "100ms"]  # fmt: skip
        for node in range(self.nodes):
            for namespace, device in (
                (self.namespace(node), "eth0"),
                (HUB, f"to{node}"),
            ):
                subprocess.run(
                    ["ip", "netns", "exec", namespace, "tc", "qdisc",
                     "replace", "dev", device, "root", *tbf],
                    check=True, capture_output=True,
                )  # fmt: skip

    def delay(self, delay_ms):
        """Holds every packet a node receives `delay_ms` before it arrives.

        A round trip between two nodes is then twice that, plus what the
        holding costs (`round_trip_ms` measures it). Needs
        `iptables-legacy` (`apt-get install iptables`) and a C compiler.
        """
        self.stop_delayers()
        self.delay_ms = delay_ms
        if not delay_ms:
            return
        delayer = build_delayer()
        for node in range(self.nodes):
            subprocess.run(
                self.command(node, [*QUEUE_TABLE, "-A", *QUEUE_RULE]),
                check=True, capture_output=True,
            )  # fmt: skip
            self.delayers.append(subprocess.Popen(
                self.command(node, [delayer, str(delay_ms)]),
                start_new_session=True,
            ))  # fmt: skip
        time.sleep(0.5)
        dead = [p.args for p in self.delayers if p.poll() is not None]
        if dead:
            self.stop_delayers()
            raise RuntimeError(f"emulated_cluster: a delayer ended: {dead}")

    def holding_cpu_s(self):
        """CPU seconds the delayers have used, the kernel's work for them in.

        (`ip netns exec` execs the delayer: its pid is theirs.)
        """
        ticks = 0
        for process in self.delayers:
            with open(f"/proc/{process.pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])  # utime, stime
        return ticks / os.sysconf("SC_CLK_TCK")

    def stop_delayers(self):
        """Ends `delay`'s holding: its processes and its rules."""
        for process in self.delayers:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        if self.delayers:
            for node in range(self.nodes):
                subprocess.run(
                    self.command(node, [*QUEUE_TABLE, "-D", *QUEUE_RULE]),
                    check=False, capture_output=True,
                )  # fmt: skip
        self.delayers = []
        self.delay_ms = 0.0

    def round_trip_ms(self, count=20):
        """Node 0's mean ping round trip to node 1, user space to user space.

        `ping -U`: the kernel stamps a packet when it comes in, before
        netfilter holds it, so plain ping would not see the delay.
        """
        out = subprocess.run(
            self.command(0, ["ping", "-U", "-q", "-c", str(count), "-i",
                             "0.05", self.address(1)]),
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        return float(out.rsplit("=", 1)[1].split("/")[1])

    def command(self, node, argv, cpus=None):
        """`argv` run in `node`'s namespace (None: the hub's).

        Pinned to `cpus` if given (taskset).
        """
        namespace = HUB if node is None else self.namespace(node)
        pin = ["taskset", "-c", str(cpus)] if cpus is not None else []
        return ["ip", "netns", "exec", namespace, *pin, *argv]

    def spawn(self, node, argv, cpus=None, **kwargs):
        """Starts `argv` on `node` (None: the hub); `stop_processes` ends it."""
        process = subprocess.Popen(
            self.command(node, argv, cpus), start_new_session=True, **kwargs
        )
        self.processes.append(process)
        return process

    def stop_processes(self):
        """Kills every process `spawn` started (and their children)."""
        for process in self.processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        self.processes = []

    def stop(self):
        self.stop_processes()
        self.stop_delayers()
        listed = _ip("netns", "list", check=False).stdout.split()
        for name in listed:
            if name.startswith(f"{PREFIX}-"):
                pids = _ip("netns", "pids", name, check=False).stdout.split()
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)
                _ip("netns", "del", name, check=False)
                shutil.rmtree(f"/etc/netns/{name}", ignore_errors=True)
