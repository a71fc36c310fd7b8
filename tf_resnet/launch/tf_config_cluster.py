"""Runs multi-worker all-reduce training on this machine: N equal workers.

  python -m tf_resnet.launch.tf_config_cluster --np=2 -- \
      --dataset=cifar10 --train_data_path='cifar-10-batches-bin/data_batch*' \
      --eval_data_path=cifar-10-batches-bin/test_batch.bin \
      --log_root=/tmp/mw_run

Everything after `--` goes to every worker's `resnet_main.py`; the launcher
adds `--distribution=multi_worker`, since these workers can run no other
mode (as the ps launcher adds `parameter_server` to its coordinator) but
`--distribution=averaging`, which is kept when given (weights averaged
every `--average_every` steps over TensorFlow's collectives), and
gives each worker a `TF_CONFIG` naming the cluster (ports picked free on
127.0.0.1) and its own index; worker 0 is the chief. A `TF_CONFIG` of the
caller is replaced.

Network isolation: TensorFlow's gRPC servers listen on every interface, so
by default the launcher first moves itself into a loopback-only network
namespace, as the other launchers do (`private_network`); `--network=host`
skips it.

The workers are peers (`processes.run_peers`): when one fails, the others
are stopped and its exit code is the launcher's; a stop signal is
forwarded to all of them (each writes its part of a final checkpoint).
A failed worker is not restarted: the launcher's last line names it, its
exit code, and that rerunning the same command resumes from the latest
checkpoint in `--log_root`.
"""

import json
import os
import sys

from tf_resnet.engines import registry
from tf_resnet.launch import cli, private_network, processes

LISTENERS = "TensorFlow's servers"
# The engines these workers can run.
WORKER_ENGINES = registry.launched_by("tf_config_cluster")
# The engine a worker runs when its flags name none.
DEFAULT_ENGINE = "multi_worker"
log = cli.logger("launch.tf_config_cluster")


def resume_advice(main_flags):
    """`fn(exit code)`: what to do after a worker failed with it.

    Every worker restores the chief's latest checkpoint in `--log_root`
    (`docs/distributed.md`, "Stop signals and preemption"), so restarting
    the workers here would do no more than a rerun, and a failure that
    repeats (bad input, no memory) would only repeat. A flag error (2) or a
    divergence (3) is the worker's own error line to read first.
    """
    log_root = cli.given_flag(main_flags, "log_root")
    where = f"--log_root={log_root}" if log_root else "its --log_root"

    def advice(code):
        if code in (2, 3):
            return "its error line above says why"
        return (
            "rerun the same command to resume from the latest checkpoint "
            f"in {where} (or from the start if there is none)"
        )

    return advice


def parse_args(argv):
    """The launcher's own flags; those after `--` go to `resnet_main.py`."""
    parser = cli.Parser(
        log,
        prog="python -m tf_resnet.launch.tf_config_cluster",
        description="Starts --np workers of --distribution=multi_worker on "
        "this machine. Flags after -- go to every resnet_main.py.",
    )
    parser.add_argument(
        "--np", type=int, required=True, help="Number of workers to start."
    )
    private_network.add_network_flag(parser, LISTENERS)
    parser.add_argument(
        "--stop_timeout_secs",
        type=float,
        default=120,
        help="How long the workers may take to checkpoint after a stop "
        "signal before they are killed.",
    )
    args = parser.parse_launcher_args(argv, dashes_required=True)
    if args.np < 1:
        parser.error("--np must be at least 1")
    parser.check_engine(args, WORKER_ENGINES, "these workers run")
    return args


def worker_engine_flag(main_flags):
    """`[--distribution=multi_worker]` where the flags leave it to `auto`.

    These workers can run no other engine but `averaging`, which is kept
    when given; `auto` would pick multi_worker too, but a log that names
    the engine is clearer.
    """
    given = cli.given_flag(main_flags, "distribution")
    if given in (None, registry.AUTO):
        return [f"--distribution={DEFAULT_ENGINE}"]
    return []


def worker_commands(main, main_flags, num_workers):
    """`{name: (command, environment)}` of each worker, for `run_peers`."""
    hosts = [f"127.0.0.1:{port}" for port in processes.free_ports(num_workers)]
    command = [sys.executable, main, *main_flags]
    command += worker_engine_flag(main_flags)
    commands = {}
    for index, host in enumerate(hosts):
        tf_config = {
            "cluster": {"worker": hosts},
            "task": {"type": "worker", "index": index},
        }
        env = {
            **os.environ,
            "TF_CONFIG": json.dumps(tf_config),
            # All workers share this machine: each takes its own device.
            "LOCAL_RANK": str(index),
            "LOCAL_WORLD_SIZE": str(num_workers),
        }
        commands[f"worker {index} at {host}"] = (command, env)
    return commands


def main(argv=None):
    """Enters the private network, runs the workers; returns the exit code."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    signals = processes.StopSignals()
    failed = private_network.apply_network_flag(args.network, LISTENERS, log)
    if failed:
        return failed
    return processes.run_peers(
        worker_commands(args.main, args.main_flags, args.np),
        log,
        stop_timeout_secs=args.stop_timeout_secs,
        signals=signals,
        advice=resume_advice(args.main_flags),
    )


if __name__ == "__main__":
    sys.exit(main())
