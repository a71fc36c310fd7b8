"""A link's one-way delay without `netem`: packets held in user space.

  python bench/link_delay.py --delay_ms=2 [--queue=0]

This kernel has no `netem` qdisc (CONFIG_NET_SCH_NETEM is off), but it
has netfilter's queue (NFQUEUE): a rule hands each packet leaving a
node's `eth0` to this process, which lets it go `--delay_ms` after it
arrived. Run inside a node's namespace with the rule
(`emulated_cluster.EmulatedCluster(delay_ms=...)` sets both up), every
packet that node sends waits that long before the link's token bucket,
so a round trip between two nodes is twice the delay.

Only each packet's metadata crosses to user space (NFQNL_COPY_META), a
segmentation-offload packet stays one packet (NFQA_CFG_F_GSO), and one
batch verdict lets every packet through that is due: the delays are
equal, so packets leave in the order they came. The process asks for
real-time scheduling, so a busy core wakes it on time.
"""

import argparse
import os
import select
import socket
import struct
import sys
import time

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET = 0
NFQNL_MSG_VERDICT_BATCH = 3
NFQNL_MSG_CONFIG = 2
NFQA_PACKET_HDR = 1
NFQA_VERDICT_HDR = 2
NFQA_CFG_CMD = 1
NFQA_CFG_PARAMS = 2
NFQA_CFG_QUEUE_MAXLEN = 3
NFQA_CFG_MASK = 4
NFQA_CFG_FLAGS = 5
NFQNL_CFG_CMD_BIND = 1
NFQNL_COPY_META = 1
NFQA_CFG_F_GSO = 4
NF_ACCEPT = 1
NLM_F_REQUEST = 1
NLMSG_ERROR = 2
NLMSG_HDR = struct.Struct("=IHHII")
MAX_QUEUED = 65536


def _attribute(kind, payload):
    length = 4 + len(payload)
    return struct.pack("=HH", length, kind) + payload + b"\0" * (-length % 4)


def _message(kind, queue, attributes, seq=0):
    body = struct.pack("!BBH", socket.AF_UNSPEC, 0, queue) + attributes
    head = NLMSG_HDR.pack(
        NLMSG_HDR.size + len(body), (NFNL_SUBSYS_QUEUE << 8) | kind,
        NLM_F_REQUEST, seq, 0,
    )  # fmt: skip
    return head + body


def _attributes(data):
    """The netlink attributes in `data`, as {kind: payload}."""
    found = {}
    while len(data) >= 4:
        length, kind = struct.unpack_from("=HH", data)
        if length < 4:
            break
        found[kind & 0x7FFF] = data[4:length]
        data = data[(length + 3) & ~3 :]
    return found


def open_queue(queue):
    """A netlink socket bound to netfilter queue `queue`."""
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 * 2**20)
    sock.bind((0, 0))
    bind = _attribute(
        NFQA_CFG_CMD, struct.pack("!BBH", NFQNL_CFG_CMD_BIND, 0, socket.AF_INET)
    )
    # The kernel takes the flags only with their mask, in one message.
    params = b"".join((
        _attribute(NFQA_CFG_PARAMS, struct.pack("!IB", 0, NFQNL_COPY_META)),
        _attribute(NFQA_CFG_QUEUE_MAXLEN, struct.pack("!I", MAX_QUEUED)),
        _attribute(NFQA_CFG_MASK, struct.pack("!I", NFQA_CFG_F_GSO)),
        _attribute(NFQA_CFG_FLAGS, struct.pack("!I", NFQA_CFG_F_GSO)),
    ))  # fmt: skip
    for seq, attributes in enumerate((bind, params), 1):
        sock.send(_message(NFQNL_MSG_CONFIG, queue, attributes, seq))
    return sock


def _packets(data):
    """The ids of the queued packets in one `recv`'s worth of messages."""
    ids = []
    while len(data) >= NLMSG_HDR.size:
        length, kind, _, _, _ = NLMSG_HDR.unpack_from(data)
        if kind == NLMSG_ERROR:
            (error,) = struct.unpack_from("=i", data, NLMSG_HDR.size)
            if error:
                raise OSError(-error, "the netfilter queue refused a message")
        elif kind == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
            header = _attributes(data[NLMSG_HDR.size + 4 : length])
            ids.append(struct.unpack_from("!I", header[NFQA_PACKET_HDR])[0])
        data = data[(length + 3) & ~3 :]
    return ids


def run(delay_s, queue):
    """Holds every packet of `queue` for `delay_s` seconds; never returns."""
    sock = open_queue(queue)
    with_real_time()
    held = []  # (due, packet id), in arrival order.
    head = 0
    while True:
        now = time.monotonic()
        due = None
        while head < len(held) and held[head][0] <= now:
            due = held[head][1]
            head += 1
        if due is not None:
            verdict = _attribute(
                NFQA_VERDICT_HDR, struct.pack("!II", NF_ACCEPT, due)
            )
            sock.send(_message(NFQNL_MSG_VERDICT_BATCH, queue, verdict))
        if head > 4096:
            del held[:head]
            head = 0
        wait = held[head][0] - now if head < len(held) else None
        ready, _, _ = select.select([sock], [], [], wait)
        if ready:
            arrived = time.monotonic() + delay_s
            while True:
                try:
                    data = sock.recv(2**20, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    break
                held.extend((arrived, i) for i in _packets(data))


def with_real_time():
    """Asks for round-robin real-time scheduling; says so if refused."""
    try:
        os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(10))
    except PermissionError:
        print("link_delay: no real-time scheduling (not root): delays "
              "stretch when the cores are busy", file=sys.stderr)  # fmt: skip


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--delay_ms", type=float, required=True)
    parser.add_argument("--queue", type=int, default=0)
    args = parser.parse_args()
    run(args.delay_ms / 1e3, args.queue)


if __name__ == "__main__":
    main()
