"""The subcommands course_job.sh calls: `python -m tf_resnet.jobs <name>`.

Each takes the shell's environment and its arguments, and returns the
lines to print on stdout (or an exit code, for a yes or no); see the
package's docstring for the protocol.
"""

import os
import subprocess
import sys

from tf_resnet.jobs import allocation, status, tasks
from tf_resnet.jobs.shell import BAD_INPUT, JobError, log, value


def _plan(env, kind, preset):
    """Checks the task and prints its plan (`tasks.Plan.lines`)."""
    task = tasks.Task(preset, env, env.get("PWD") or os.getcwd())
    return tasks.PLANS[kind](task).lines()


def _need_data(env, path, download_flags, variables):
    error = tasks.missing_data(path, download_flags, variables, env)
    if error:
        raise JobError(error)
    return []


def _horovod(env):
    plan = allocation.horovod_plan(
        allocation.job_slots(env),
        value(env, "LAUNCHER"),
        value(env, "RANKS_PER_NODE"),
    )
    return [str(x) for x in plan]


def _workers(env):
    found = allocation.addresses(env, "MW_PORT")
    return [str(len(found)), ",".join(found)]


def _servers(env):
    found = allocation.addresses(env, "PS_PORT")
    return [
        str(len(found)),
        *allocation.parameter_servers(found, value(env, "NUM_PS", "1")),
    ]


def _failed_task(env, directory):
    failed = status.failed_task(status.read_codes(directory))
    return [" ".join(failed)] if failed else []


def _stop_report(env, stopped=""):
    for line in status.stop_report(env, stopped):
        log(line)
    return []


def _requeue_line(env):
    log(
        f"requeueing job {env['SLURM_JOB_ID']}; it resumes from "
        f"{status.newest_checkpoint(env.get('RUN_DIR', ''))}"
    )
    return []


def _lost_task(env):
    requeue, line = status.requeue_after_lost_task(env)
    if line:
        log(line)
    return 0 if requeue else 1


def _without_gpus(env):
    """Whether a requeued Slurm job must requeue itself again.

    Exit 0: Slurm started it without its GPUs (a Slurm bug,
    `status.started_without_gpus`), so it requeues itself; 1: it has
    them, or is no requeued Slurm job; 2, with an error line: without
    them, and restarted MAX_REQUEUES times.
    """
    restarts = value(env, "SLURM_RESTART_COUNT", "0")
    if env["SCHEDULER"] != "slurm" or restarts == "0":
        return 1
    command = ["scontrol", "show", "job", "-d", env["SLURM_JOB_ID"]]
    try:
        record = subprocess.run(
            command, check=True, capture_output=True, text=True
        ).stdout
    except (OSError, subprocess.CalledProcessError) as error:
        log(f"could not check the job's GPUs ({' '.join(command)}: {error})")
        return 1
    requeue, line = status.requeue_without_gpus(env, record)
    if line and not requeue:
        raise JobError(line)
    if line:
        log(line)
    return 0 if requeue else 1


def _wait_for_servers(env, servers, *pids):
    """Exit 1 when a server is not up (the job's coordinator never runs)."""
    try:
        allocation.wait_for_servers(
            servers.split(","),
            [int(pid) for pid in pids],
            float(value(env, "START_TIMEOUT", "300")),
        )
    except JobError as error:
        log(f"error: {error}")
        return 1
    return 0


def _stop_training(env):
    status.stop_training(env)
    return []


SUBCOMMANDS = {
    # KIND PRESET: run dir, job script, step status, servers, the command.
    "plan": _plan,
    "need_data": _need_data,  # PATH DOWNLOAD_FLAGS VARIABLES
    "slots": lambda env: allocation.job_slots(env),
    "horovod_hosts": lambda env: [
        allocation.horovod_hosts(allocation.job_slots(env))
    ],
    "horovod": _horovod,  # ranks, -H hosts, aprun's per node
    "workers": _workers,  # count, multi_worker's --worker_hosts
    "servers": _servers,  # count, --ps_hosts, --worker_hosts
    "port": lambda env: [str(allocation.job_port(env))],
    "failed_task": _failed_task,  # STEP_STATUS
    "exit_cause": lambda env, code: [status.exit_cause(code)],
    "stop_report": _stop_report,  # SIGNAL NAME or ""
    "requeue_line": _requeue_line,
    "lost_task": _lost_task,  # exit 0: requeue
    "without_gpus": _without_gpus,  # exit 0: requeue
    "stop_training": _stop_training,
    "wait_for_servers": _wait_for_servers,  # HOST:PORT,... PID...
}


def main(argv=None, env=None):
    """Runs one subcommand; returns its exit code (2 for a failed check)."""
    argv = sys.argv[1:] if argv is None else argv
    env = os.environ if env is None else env
    try:
        result = SUBCOMMANDS[argv[0]](env, *argv[1:])
    except JobError as error:
        log(f"error: {error}")
        return BAD_INPUT
    if isinstance(result, int):
        return result
    for line in result:
        print(line)
    return 0
