"""How a batch job's training ended, and how it goes on.

Which task's exit code a failed job step ends with and what it means,
where a stopped run resumes and the command that resumes it, whether a
step that lost a task requeues the job, and the stop of the training
processes when the time limit is near.
"""

import contextlib
import os
import re
import shutil
import signal
import subprocess

from tf_resnet.jobs.shell import job_id, proc_stat, value
from tf_resnet.peer_watch import LOST_PEER

# What resnet_main.py's exit codes mean (its docstring).
EXIT_CAUSES = {
    2: "bad flags or data (its error: line above names them)",
    3: "the training diverged (its error: line above names the step)",
    LOST_PEER: "it lost a peer: a node or a process of the job is gone, cut "
    "off or silent for --peer_timeout_secs",
}


def step_status_dir(env, cwd):
    """A fresh folder for the exit codes of this run of the job.

    On the shared file system (the tasks run on other nodes), beside the
    job's output; a requeued job's run has its own (SLURM_RESTART_COUNT),
    and so has each batch shell (JOB_SHELL, its pid): jobs that share a
    job id, as stand-in jobs do, must not empty each other's.
    """
    base = value(env, "SLURM_SUBMIT_DIR", cwd)
    restart = value(env, "SLURM_RESTART_COUNT", "0")
    shell = value(env, "JOB_SHELL", "0")
    directory = f"{base}/.tf-resnet-steps/{job_id(env)}.{restart}.{shell}"
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory, exist_ok=True)
    return directory


def failed_task(codes):
    """`(task, code)` whose code the failed step ends with, or None.

    `codes` is `{task: code}` as the tasks wrote them (scripts/task.sh),
    in the folder's order. The first task that failed of itself wins over
    one that lost its peers (4): when one task fails, the others of the
    step exit 4, and only the first says why.
    """
    lost = None
    for task, code in codes.items():
        if code == str(LOST_PEER):
            lost = lost or (task, code)
        elif code and code != "0":
            return task, code
    return lost


def read_codes(directory):
    """`{task: code}` of the step status folder, in the shell's glob order.

    A folder that is gone holds none, as the shell's glob found none in
    it: a polling job must not fail on it.
    """
    codes = {}
    names = os.listdir(directory) if os.path.isdir(directory) else []
    for name in sorted(names):
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            with open(path) as stream:
                codes[name] = stream.read().rstrip("\n")
    return codes


def exit_cause(code):
    """What resnet_main.py's exit code says went wrong."""
    return EXIT_CAUSES.get(int(code), "see its output above")


def newest_checkpoint(directory, index_text=None):
    """The run's newest checkpoint, as "step N (DIR/ckpt-N)".

    From TensorFlow's `checkpoint` index in the run directory (its
    model_checkpoint_path line); "none in DIR, so it starts over" before
    the first.
    """
    if index_text is None:
        try:
            with open(f"{directory}/checkpoint") as stream:
                index_text = stream.read()
        except OSError:
            index_text = ""
    found = re.search(r'^model_checkpoint_path: "(.*)"$', index_text, re.M)
    if found and found[1]:
        name = found[1].rpartition("/")[2]
        return f"step {name.rpartition('-')[2]} ({directory}/{name})"
    return f"none in {directory or 'the run directory'}, so it starts over"


def resume_command(scheduler, directory, script):
    """The command that submits the stopped run again, where it stopped."""
    if scheduler == "pbs":
        return f"qsub -v LOG_ROOT={directory} {script}"
    return f"LOG_ROOT={directory} sbatch {script}"


def stop_report(env, stopped):
    """The job's last two lines after a stop signal (or PBS's time limit).

    Where the run stopped and how it goes on. The training processes say
    so too, but a launcher may drop their last lines (horovodrun ends the
    ssh sessions of other nodes' ranks on SIGTERM), so the job says it
    from what is on disk.
    """
    directory = env.get("RUN_DIR", "")
    how = resume_command(env["SCHEDULER"], directory, env.get("JOB_SCRIPT", ""))
    by = f" by SIG{stopped}" if stopped else ""
    return [
        f"stopped{by}; the newest checkpoint: {newest_checkpoint(directory)}",
        "to resume there, submit it again from the repository with the same "
        f"LOG_ROOT: {how} (a job the scheduler requeues resumes by itself)",
    ]


def requeue_after_lost_task(env):
    """`(requeue?, line)` for a step that lost a task (exit 4).

    A lost node or process is what a requeue fixes, from the last
    checkpoint (`requeue_within_bound`); only Slurm requeues (`line` is
    None under PBS).
    """
    if env["SCHEDULER"] != "slurm":
        return False, None
    return requeue_within_bound(env, "a task lost its peers (exit 4)")


def started_without_gpus(record):
    """Whether Slurm started the job without the GPUs it asked for.

    `record` is `scontrol show job -d`'s: a request for GPUs
    (`TresPerNode=gres:gpu:2`, or per job, socket or task) and no GRES in
    the allocation (`JOB_GRES=(null)`). Slurm 21.08 to 23.02.1 may start a
    requeued job so, and then no job step that needs the GPUs starts
    (docs/reliability.md); a job that starts again gets them.
    """
    asked = re.search(r"\bTresPer(?:Job|Node|Socket|Task)=\S*\bgpu\b", record)
    granted = re.search(r"\bJOB_GRES=(\S*)", record)
    return bool(asked and granted and granted[1] == "(null)")


def requeue_without_gpus(env, record):
    """`(requeue?, line)` for a requeued Slurm job and its `record`.

    `line` is None where it has its GPUs (`started_without_gpus`); else
    it requeues itself (`requeue_within_bound`).
    """
    if not started_without_gpus(record):
        return False, None
    return requeue_within_bound(
        env,
        "Slurm started this requeued job without the GPUs it asked for "
        "(JOB_GRES=(null): a bug of Slurm 21.08 to 23.02.1, which leaves "
        "them counted as used until `scontrol reconfigure`; see "
        "docs/reliability.md)",
    )


def requeue_within_bound(env, what):
    """`(requeue?, line)` after `what` went wrong in a Slurm job.

    A job requeues itself up to MAX_REQUEUES times (default 2), counted
    by Slurm's SLURM_RESTART_COUNT whatever made it requeue: past those,
    the cause is most likely not one that a requeue fixes.
    """
    restarts = int(value(env, "SLURM_RESTART_COUNT", "0"))
    most = value(env, "MAX_REQUEUES", "2")
    if restarts >= int(most):
        return False, (
            f"{what}; restarted {restarts} times already "
            f"(MAX_REQUEUES={most}): not requeueing"
        )
    return True, f"{what}: requeueing, restart {restarts + 1} of at most {most}"


def _children():
    """`{pid: [child pids]}` of the processes this user may see."""
    children = {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            parent = int(proc_stat(name)[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(parent, []).append(int(name))
    return children


def descendants(pid):
    """The processes below `pid`, parents before their children."""
    children, found, queue = _children(), [], [pid]
    while queue:
        below = children.get(queue.pop(0), [])
        found += below
        queue += below
    return found


def stop_training(env):
    """SIGTERM to the job's training processes, as the scheduler's stop.

    Those the batch shell (JOB_SHELL) started, `python resnet_main.py`
    itself, not a launcher naming it; and under Slurm the tasks of its job
    steps (`scancel --signal=TERM`). Not to srun: srun ends its tasks with
    SIGKILL on SIGTERM.
    """
    for pid in descendants(int(env["JOB_SHELL"])):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as stream:
                args = stream.read().split(b"\0")
        except OSError:
            continue
        if len(args) > 1 and args[1].endswith(b"resnet_main.py"):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
    if env["SCHEDULER"] == "slurm":
        # No scancel: nothing of the job's to signal.
        with contextlib.suppress(OSError):
            subprocess.run(
                ["scancel", "--signal=TERM", env["SLURM_JOB_ID"]],
                stderr=subprocess.DEVNULL, check=False,
            )  # fmt: skip
