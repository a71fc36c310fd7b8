"""The bench's link latency without netem: packets held in user space.

`bench/link_delay.c` holds what a node receives (netfilter's queue);
here on two real network namespaces, timed by a TCP round trip between
two processes, as the bench's jobs see it.
"""

import os
import shutil
import subprocess
import sys
import time

import pytest

from tests import two_nodes
from tests.helpers import ROOT

sys.path.insert(0, os.path.join(ROOT, "bench"))
import emulated_cluster  # noqa: E402

# node2 echoes; node1 times round trips of one byte, user space to user
# space, and prints the median in milliseconds.
ECHO = """
import socket
server = socket.create_server(("0.0.0.0", 7801))
connection, _ = server.accept()
while data := connection.recv(1):
    connection.sendall(data)
"""
TIME = """
import socket, statistics, time
connection = socket.create_connection(("{address}", 7801), timeout=10)
connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
rounds = []
for _ in range(9):
    start = time.monotonic()
    connection.sendall(b"x")
    connection.recv(1)
    rounds.append(time.monotonic() - start)
print(1e3 * statistics.median(rounds))
"""


def round_trip_ms(nodes):
    server = subprocess.Popen([*nodes.enter("node2"), sys.executable, "-c",
                               ECHO])  # fmt: skip
    try:
        for _ in range(50):
            out = subprocess.run(
                [*nodes.enter("node1"), sys.executable, "-c",
                 TIME.format(address=two_nodes.ADDRESSES["node2"])],
                capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            if out.returncode == 0:
                return float(out.stdout)
            time.sleep(0.1)  # The echo server not listening yet.
        raise AssertionError(out.stderr[-2000:])
    finally:
        server.kill()
        server.wait()


@pytest.mark.skipif(bool(two_nodes.usable()), reason=two_nodes.usable())
@pytest.mark.skipif(
    not all(map(shutil.which, emulated_cluster.DELAY_PROGRAMS)),
    reason=f"needs {' and '.join(emulated_cluster.DELAY_PROGRAMS)} "
    "(apt-get install iptables gcc)",
)
def test_each_node_holds_what_it_receives_for_the_delay():
    with two_nodes.Nodes() as nodes:
        plain = round_trip_ms(nodes)
        delayers = []
        for node in ("node1", "node2"):
            nodes.run(node, [*emulated_cluster.QUEUE_TABLE, "-A",
                             *emulated_cluster.QUEUE_RULE])  # fmt: skip
            delayers.append(subprocess.Popen(
                [*nodes.enter(node), emulated_cluster.build_delayer(), "20"]
            ))  # fmt: skip
        time.sleep(0.5)
        assert all(d.poll() is None for d in delayers)
        delayed = round_trip_ms(nodes)
        for delayer in delayers:
            delayer.kill()
            delayer.wait()
    assert plain < 10
    # One hold each way, and not much more: what the holding adds.
    assert 40 <= delayed < 40 + max(10, 3 * plain), (plain, delayed)
