"""A bound on how long a process of a multi-process run waits for its peers.

A peer that dies resets its connections and the collectives fail at once;
one cut off by the network (a link down, a partition) or frozen sends
nothing at all, and what then ends the wait depends on the engine: Gloo's
timeout (`HOROVOD_GLOO_TIMEOUT_SECONDS`, 30 s by default) under
horovodrun, TensorFlow's coordination service and collective timeout under
`multi_worker`, nothing under Horovod on MPI (`mpirun`, `srun --mpi`): its
ranks wait in the all-reduce until the job is killed (Horovod's stall
inspector watches tensors some ranks submitted and others not, from the
coordinator's negotiation, which is itself a collective with the lost
rank).

`PeerWatch` is the bound every engine gets (`--peer_timeout_secs`): a thread
that ends the process with `LOST_PEER` (the exit code of a lost task, which
the batch jobs requeue on) when no progress was marked for that long. The
training loop marks progress at every finished step, and before and after
each evaluation and checkpoint save, so the bound is on the longest
stretch between two marks: a step (the first one compiles), an evaluation,
a save, or the wait for a peer in one of them (a peer's save, its slower
start). Its last words are one line, the same as a lost-peer error's that
the engine raised itself (`lost_peer_line`): the step, the peers, the
newest complete checkpoint on disk and the command that resumes it.

It ends the process with `os._exit`: the thread that waits on the peers is
in a collective that neither Python nor TensorFlow can interrupt.
"""

import os
import re
import threading
import time

# resnet_main.py's exit code of a lost peer (a task of the cluster gone or
# silent): the batch jobs requeue the job on it (tf_resnet/launch/batch_job.py).
LOST_PEER = 4


def newest_checkpoint(log_root):
    """The newest complete checkpoint in `log_root`, from its index, or None.

    TensorFlow writes the `checkpoint` index only after the checkpoint's
    files, so what it names is complete. Read as text, without TensorFlow:
    the watch's thread must not wait on a lock the stuck one holds.
    """
    try:
        with open(os.path.join(log_root, "checkpoint")) as stream:
            text = stream.read()
    except OSError:
        return None
    found = re.search(r'^model_checkpoint_path: "(.*)"$', text, re.M)
    if not (found and found[1]):
        return None
    path = found[1]
    return path if os.path.isabs(path) else os.path.join(log_root, path)


def lost_peer_line(step, peers, log_root, what):
    """The one line a process that lost its peers ends with.

    Args:
      step: the last step this process finished (None: not known).
      peers: who this process waits on, in words (`Distributor.peers`).
      log_root: the run directory, where the checkpoint is.
      what: how the loss showed: the engine's error, or the bound.
    """
    at = "" if step is None else f" after step {step}"
    checkpoint = newest_checkpoint(log_root)
    resume = (
        f"the newest complete checkpoint is {checkpoint}, which the same "
        "command resumes from"
        if checkpoint
        else "no checkpoint was written yet: the same command starts over"
    )
    return (
        f"resnet_main: error: lost a task of the training cluster{at} "
        f"({what}; waiting on {peers}); {resume} (a batch job requeues "
        "itself on this exit code, 4)"
    )


class PeerWatch:
    """Ends this process when no progress was marked for `bound_secs`.

    Use as a context manager around the part of the run that waits on
    peers; `mark(step)` at each point of progress. `peers` empty: a
    process without peers, which is not watched (no thread).
    """

    def __init__(self, bound_secs, peers, log_root):
        self.bound_secs = bound_secs
        self.peers = peers
        self.log_root = log_root
        self.step = None
        self._last = time.monotonic()
        self._done = threading.Event()
        self._thread = None

    def mark(self, step=None):
        """Progress: the bound starts again (`step`: the step finished)."""
        if step is not None:
            self.step = step
        self._last = time.monotonic()

    def line(self, what):
        """This process's lost-peer line at the current step."""
        return lost_peer_line(self.step, self.peers, self.log_root, what)

    def __enter__(self):
        self.mark()
        if self.peers:
            self._thread = threading.Thread(
                target=self._watch, name="peer_watch", daemon=True
            )
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._done.set()
        if self._thread is not None:
            self._thread.join()

    def _watch(self):
        # Checks a few times per bound: the end comes within 10% of it.
        every = min(max(self.bound_secs / 10, 0.1), 5.0)
        while not self._done.wait(every):
            silent = time.monotonic() - self._last
            if silent >= self.bound_secs:
                self._end(silent)

    def _end(self, silent):
        line = self.line(
            f"no progress for {silent:.0f} s, beyond --peer_timeout_secs="
            f"{self.bound_secs:g}: a peer is gone, cut off or frozen"
        )
        # Straight to the file descriptor: the stuck thread may hold the
        # locks of sys.stderr or of logging.
        os.write(2, f"{line}\n".encode())
        os._exit(LOST_PEER)
