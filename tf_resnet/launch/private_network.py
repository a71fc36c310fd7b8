"""A loopback-only network namespace for the local multi-process launchers.

TensorFlow's gRPC servers (parameter-server training) and `horovodrun`'s
rendezvous server listen on `0.0.0.0`, whatever address the cluster names.
A launcher that runs every process of a job on this machine first moves
itself into a new network namespace whose only device is the loopback, so
nothing the job opens is reachable from outside. Its children inherit the
namespace; the file system, the process ids and the users stay the same.
"""

import ctypes
import fcntl
import os
import socket
import struct

CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1


def _unshare(flags):
    if ctypes.CDLL(None, use_errno=True).unshare(flags) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def enter_private_network():
    """Moves this process into a new network namespace with only `lo` up.

    Root (with CAP_SYS_ADMIN) gets a plain network namespace; other users
    get it inside a user namespace that maps their own uid and gid, so the
    files the job writes keep their owner. The kernel refuses a user
    namespace to a process with more than one thread, hence the launchers
    import no TensorFlow (see `tf_resnet/launch/__init__.py`).

    Raises:
      OSError: the namespace could not be created or is not loopback-only.
    """
    uid, gid = os.getuid(), os.getgid()
    try:
        _unshare(CLONE_NEWNET)
    except PermissionError:
        threads = len(os.listdir("/proc/self/task"))
        if threads > 1:
            raise OSError(
                f"this process runs {threads} threads; a user namespace needs "
                "a single-threaded one (was TensorFlow imported before?)"
            ) from None
        _unshare(CLONE_NEWUSER | CLONE_NEWNET)
        for name, text in (
            ("setgroups", "deny"),
            ("uid_map", f"{uid} {uid} 1"),
            ("gid_map", f"{gid} {gid} 1"),
        ):
            with open(f"/proc/self/{name}", "w") as stream:
                stream.write(text)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack(
            "16sH22x", fcntl.ioctl(sock, SIOCGIFFLAGS, request)
        )
        fcntl.ioctl(
            sock, SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags[1] | IFF_UP)
        )
    interfaces = [name for _, name in socket.if_nameindex()]
    if interfaces != ["lo"]:
        raise OSError(f"private namespace has interfaces {interfaces}")


def add_network_flag(parser, listeners):
    """`--network=private|host`, the flag every launcher shares.

    Args:
      parser: the launcher's `argparse.ArgumentParser`.
      listeners: what would listen on all interfaces, for the help text
        (e.g. "TensorFlow's servers").
    """
    parser.add_argument(
        "--network",
        choices=("private", "host"),
        default="private",
        help="private: a loopback-only network namespace (default); host: "
        f"{listeners} listen on all interfaces.",
    )


def apply_network_flag(network, listeners, log):
    """Enters the private namespace unless `--network=host`; logs which.

    Returns:
      2 (the launcher's exit code) when the namespace cannot be created,
      after logging one line saying why and what to do; else None.
    """
    if network == "host":
        log(f"--network=host: {listeners} listen on all network interfaces")
        return None
    try:
        enter_private_network()
    except OSError as error:
        log(
            f"error: cannot create a private network namespace ({error}). "
            f"{listeners} listen on all interfaces, so the launcher keeps "
            "them in one. Run as root, allow unprivileged user namespaces, or "
            "pass --network=host to accept open ports while the job runs."
        )
        return 2
    log("the job runs in a private network namespace (loopback only)")
    return None
