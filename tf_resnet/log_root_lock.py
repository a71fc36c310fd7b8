"""The lock that gives a `--log_root` one training run at a time.

Two runs writing one `--log_root` would interleave one history of
checkpoints and summaries. The chief holds `log_root/run.lock`, a file
naming its process (pid, host, and the machine whose pids those are), and
touches it every `REFRESH_SECS` while it trains, so that a run elsewhere
can tell a live holder from a dead one without reaching it.

A run that finds a lock watches its holder, and takes it over as soon as
the holder is gone:
- on this machine, when its process is gone (at once if it already is;
  a restarted job may meet its previous attempt's chief still being
  killed, as after Ray Train's restart); refused if it still lives after
  `STALE_SECS`;
- elsewhere, when the lock goes untouched for `STALE_SECS` (its run was
  killed or its node lost, and the job now runs here); refused if it is
  still touched after twice that. Only the lock's changes are compared,
  never the clocks of two machines.

"This machine" is where the holder's pid means the same process: the
same boot of the same kernel and the same PID namespace. A host name
does not say it: containers, and nodes a test emulates with namespaces,
share one name and not their pids.
"""

import contextlib
import json
import os
import socket
import threading
import time

from absl import logging

from tf_resnet.errors import UserInputError

LOCK_FILE = "run.lock"
# The holder touches its lock this often; a lock untouched for
# `STALE_SECS` (several missed touches, for a loaded machine or a slow
# shared file system) has no live holder on another host.
REFRESH_SECS = 5
STALE_SECS = 20
_POLL_SECS = 0.5


@contextlib.contextmanager
def hold(log_root):
    """Holds `log_root/run.lock` while a training run writes `log_root`.

    Raises:
      UserInputError: another live run holds the lock.
    """
    path = os.path.join(log_root, LOCK_FILE)
    me = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "pids": _pid_space(),
    }
    _take(path, me)
    stop = threading.Event()
    toucher = threading.Thread(
        target=_touch_while_held, args=(path, me, stop), daemon=True
    )
    toucher.start()
    try:
        yield
    finally:
        stop.set()
        toucher.join()
        if _read(path) == me:
            os.unlink(path)


def _take(path, me):
    for _ in range(50):
        try:
            handle = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            _wait_until_free(path, me)
            continue
        with os.fdopen(handle, "w") as stream:
            json.dump(me, stream)
        return
    raise UserInputError(f"{path}: could not take the lock")


def _wait_until_free(path, me):
    """Returns once `path` is released or taken over; raises if it is held."""
    holder = _read_written(path)
    if holder is None:
        if os.path.exists(path):
            _take_over(path, None, "an unreadable lock")
        return
    here = holder.get("pids") == me["pids"]
    watch_secs = STALE_SECS if here else 2 * STALE_SECS
    logging.info(
        "%s: held by process %s on host %s; watching it for up to %d s",
        path,
        holder.get("pid"),
        holder.get("host"),
        watch_secs,
    )
    start = last_touch = time.monotonic()
    stamp = _stamp(path)
    while True:
        now = time.monotonic()
        if _read(path) != holder:
            return  # Released, or taken by another run: try again.
        if here and not _alive(holder.get("pid")):
            _take_over(path, holder, "which is gone")
            return
        if not here:
            if (current := _stamp(path)) != stamp:
                stamp, last_touch = current, now
            elif now - last_touch >= STALE_SECS:
                _take_over(
                    path,
                    holder,
                    f"on host {holder.get('host')}, untouched for "
                    f"{STALE_SECS} s",
                )
                return
        if now - start >= watch_secs:
            _refuse(path, holder)
        time.sleep(_POLL_SECS)


def _read_written(path):
    """The holder in `path`, given a second to be written; None if none."""
    for _ in range(10):
        holder = _read(path)
        if holder is not None or not os.path.exists(path):
            return holder
        time.sleep(0.1)
    return None


def _take_over(path, holder, why):
    pid = holder.get("pid") if holder else None
    logging.warning(
        "%s: taking over the lock of process %s, %s", path, pid, why
    )
    if _read(path) == holder:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _refuse(path, holder):
    raise UserInputError(
        f"{path}: --log_root is in use by the run of process "
        f"{holder.get('pid')} on host {holder.get('host')}; wait for it, "
        "stop it, or use another --log_root (remove the lock file only if "
        "that process is gone)"
    )


def _touch_while_held(path, me, stop):
    while not stop.wait(REFRESH_SECS):
        if _read(path) != me:
            logging.error(
                "%s: this run's lock was removed or taken over; another run "
                "may now write this --log_root too",
                path,
            )
            return
        with contextlib.suppress(OSError):
            os.utime(path)


def _pid_space():
    """Where pids mean one process: this boot's id and PID namespace."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            boot = f.read().strip()
        return f"{boot} {os.readlink('/proc/self/ns/pid')}"
    except OSError:  # No /proc: the host name is all there is.
        return socket.gethostname()


def _stamp(path):
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


def _read(path):
    try:
        with open(path, encoding="utf-8") as stream:
            holder = json.load(stream)
    except (OSError, ValueError):
        return None
    return holder if isinstance(holder, dict) else None


def _alive(pid):
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
