"""What the batch shell gives a job's decisions and gets back from them.

Its variables (`value`, `job_id`), its log (`log`), the error of a
check (`JobError`), which the job logs and ends with exit 2, and the
state of the processes it started (`proc_stat`).
"""

import sys
import time

BAD_INPUT = 2


class JobError(Exception):
    """A check failed: its message is logged as an error, the job exits 2."""


def log(message):
    """Writes one line of the job's log, as course_job.sh's `log` does."""
    stamp = time.strftime("%H:%M:%S", time.gmtime())
    sys.stderr.write(f"{stamp} course_job: {message}\n")
    sys.stderr.flush()


def value(env, name, default=""):
    """`${NAME:-default}`: an empty variable counts as unset, as in bash."""
    return env.get(name) or default


def job_id(env):
    """The scheduler's job id, without PBS's server name (`42.server`).

    A requeued Slurm job keeps its id, so the default run directory and
    the step status folder of its next run are the same.
    """
    if env["SCHEDULER"] == "slurm":
        return env["SLURM_JOB_ID"]
    return env["PBS_JOBID"].split(".", 1)[0]


def proc_stat(pid):
    """The fields of `/proc/<pid>/stat` after the command's name.

    State first, then the parent's pid. The name, in parentheses, may hold
    spaces and parentheses itself, so the fields start after the last ")".

    Raises:
      OSError: no such process (or none this user may see).
    """
    with open(f"/proc/{pid}/stat") as stream:
        return stream.read().rpartition(")")[2].split()
