"""The lock of a `--log_root` against holders alive, dying, stopped, dead.

On this machine the holders are real processes holding the lock
(`lock_holder`), then killed or stopped; the contender's waits are
shortened. A holder on another machine is a lock file naming one, touched
(or not) as a live (or a killed) holder would: its pids are out of this
machine's reach, as they are for a run on another node. Training runs
that meet a lock are in test_run_directory.py and test_multi_worker.py.
"""

import json
import os
import signal
import socket
import threading
import time

import pytest
from absl import logging

from tests.helpers import lock_holder, on_newest_set
from tf_resnet import log_root_lock
from tf_resnet.errors import UserInputError

pytestmark = on_newest_set  # Plain Python (tests/helpers.py).


@pytest.fixture(autouse=True)
def short_waits(monkeypatch):
    monkeypatch.setattr(log_root_lock, "REFRESH_SECS", 0.2)
    monkeypatch.setattr(log_root_lock, "STALE_SECS", 2)


@pytest.fixture
def warnings(monkeypatch):
    said = []
    monkeypatch.setattr(
        logging, "warning", lambda message, *args: said.append(message % args)
    )
    return said


@pytest.fixture
def holder(tmp_path):
    proc = lock_holder(tmp_path)
    yield proc
    proc.kill()
    proc.wait()


def lock_of(log_root):
    return json.loads((log_root / log_root_lock.LOCK_FILE).read_text())


def take(log_root):
    with log_root_lock.hold(str(log_root)):
        return lock_of(log_root)


ELSEWHERE = {"pid": 4242, "host": "node7", "pids": "another boot"}


def elsewhere(log_root):
    """The lock of process 4242 on another node; returns its path."""
    path = log_root / log_root_lock.LOCK_FILE
    path.write_text(json.dumps(ELSEWHERE))
    return path


def touching(path):
    """Touches `path` with the holder's own toucher, as that live holder
    would, until the returned event is set (the holder killed)."""
    killed = threading.Event()
    threading.Thread(
        target=log_root_lock._touch_while_held,
        args=(str(path), ELSEWHERE, killed),
        daemon=True,
    ).start()
    return killed


def test_the_holder_touches_its_lock_and_removes_it(tmp_path):
    path = tmp_path / log_root_lock.LOCK_FILE
    with log_root_lock.hold(str(tmp_path)):
        held = lock_of(tmp_path)
        assert (held["pid"], held["host"]) == (
            os.getpid(),
            socket.gethostname(),
        )
        first = path.stat().st_mtime_ns
        time.sleep(1)
        assert path.stat().st_mtime_ns > first
    assert not path.exists()


def test_a_killed_holder_here_is_taken_over_at_once(tmp_path, holder, warnings):
    holder.kill()
    holder.wait()
    started = time.monotonic()
    assert take(tmp_path)["pid"] == os.getpid()
    assert time.monotonic() - started < 1
    assert warnings == [
        f"{tmp_path / 'run.lock'}: taking over the lock of process "
        f"{holder.pid}, which is gone"
    ]


def test_a_holder_still_dying_here_is_waited_for(tmp_path, holder, warnings):
    """A restarted job's chief meets the last attempt's, being killed."""

    def kill_in_a_second():
        time.sleep(1)
        holder.kill()
        holder.wait()

    threading.Thread(target=kill_in_a_second).start()
    assert take(tmp_path)["pid"] == os.getpid()
    assert holder.returncode == -signal.SIGKILL
    assert warnings[-1].endswith(f"process {holder.pid}, which is gone")


def test_a_live_holder_here_is_refused(tmp_path, holder):
    with pytest.raises(UserInputError, match=f"process {holder.pid} on host"):
        take(tmp_path)
    assert lock_of(tmp_path)["pid"] == holder.pid


def test_a_stopped_holder_here_is_refused_though_it_touches_nothing(
    tmp_path, holder
):
    """A suspended job (SIGSTOP) will go on when it is resumed."""
    holder.send_signal(signal.SIGSTOP)
    try:
        started = time.monotonic()
        with pytest.raises(UserInputError, match=f"process {holder.pid} "):
            take(tmp_path)
        assert time.monotonic() - started >= log_root_lock.STALE_SECS
    finally:
        holder.send_signal(signal.SIGCONT)
    assert lock_of(tmp_path)["pid"] == holder.pid


@pytest.mark.skipif(os.geteuid() != 0, reason="unshare --pid needs root")
def test_a_holder_in_another_pid_namespace_is_judged_by_its_touches(
    tmp_path, warnings
):
    """A container, or a node emulated by namespaces: the same host name,
    and the holder's pid (1 in its namespace) names another process here."""
    holder = lock_holder(
        tmp_path, prefix=("unshare", "--pid", "--fork", "--kill-child")
    )
    try:
        assert lock_of(tmp_path)["pid"] == 1
        assert lock_of(tmp_path)["host"] == socket.gethostname()
        with pytest.raises(UserInputError, match="process 1 on host"):
            take(tmp_path)
    finally:
        holder.kill()
        holder.wait()
    assert take(tmp_path)["pid"] == os.getpid()
    assert warnings[-1].endswith(", untouched for 2 s")


def test_a_live_run_elsewhere_is_refused(tmp_path):
    killed = touching(elsewhere(tmp_path))
    started = time.monotonic()
    try:
        with pytest.raises(UserInputError) as refused:
            take(tmp_path)
    finally:
        killed.set()
    assert time.monotonic() - started >= 2 * log_root_lock.STALE_SECS
    assert "in use by the run of process 4242 on host node7" in str(
        refused.value
    )
    assert lock_of(tmp_path)["host"] == "node7"


def test_a_run_killed_elsewhere_while_watched_is_taken_over(tmp_path, warnings):
    """Its touches stop a second into the watch; STALE_SECS later the
    lock is taken over."""
    killed = touching(elsewhere(tmp_path))
    threading.Timer(1, killed.set).start()
    started = time.monotonic()
    assert take(tmp_path)["pid"] == os.getpid()
    assert time.monotonic() - started >= 1 + log_root_lock.STALE_SECS - 0.3
    assert warnings[-1].endswith("untouched for 2 s")


def test_an_untouched_lock_from_elsewhere_is_taken_over(tmp_path, warnings):
    """A run killed on a node that is gone: the job now runs here."""
    path = elsewhere(tmp_path)
    started = time.monotonic()
    assert take(tmp_path)["pid"] == os.getpid()
    assert time.monotonic() - started >= log_root_lock.STALE_SECS
    assert warnings == [
        f"{path}: taking over the lock of process 4242, on host node7, "
        "untouched for 2 s"
    ]


def test_an_unreadable_lock_is_taken_over(tmp_path, warnings):
    path = tmp_path / log_root_lock.LOCK_FILE
    path.write_text("{not json")
    assert take(tmp_path)["pid"] == os.getpid()
    assert warnings == [
        f"{path}: taking over the lock of process None, an unreadable lock"
    ]
