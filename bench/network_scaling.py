"""Scaling across an emulated network: every engine on 1 node and on 2.

  .venv/bin/python bench/network_scaling.py --out=runs/network_scaling.json

(as root: it makes network namespaces; `apt-get install iperf3` first, and
for `--latency_us`, `iptables iputils-ping` and a C compiler.)

Nodes are network namespaces on a bridge whose links are rate-shaped in
both directions (`emulated_cluster`); each process of a job runs in its
node's namespace, pinned to its own core, so "2 nodes" is one worker per
node, one core each. Everything else is the project's own: each process
runs the training step of its engine's `Distributor` (the loop's
`make_replica_fn`, the mode's all-reduce) on a fixed batch, started the
way that engine's processes are (Horovod's Gloo rendezvous and
`HOROVOD_*` variables as `horovodrun` sets them; `TF_CONFIG` for
multi_worker; ps and worker servers of `resnet_main.py --job_name` and a
coordinator for parameter_server).

The network stands for a real one seen from a GPU: a 2-core CPU step is
far slower than a GPU step, so the link is slowed by the same factor,
`s = CPU step / GPU step` (the GPU step times are named in
`tf_resnet.scaling.GPU_STEPS`), which keeps the compute-to-communication
ratio the GPU's. `s` is measured per model from its 1-node step.

Per model it prints, and writes to `--out`:
  * the shaped link checked with iperf3 (TCP goodput against the rate),
    and with `--latency_us` its ping round trip;
  * the all-reduce time against message size on 2 and 4 processes, per
    transport (Horovod's Gloo, TensorFlow's collectives), and the ring
    model `c + 2(p-1)a + 2(p-1)/p n/B` fitted to it;
  * the step time of each engine on 1 node and on 2, and its efficiency
    against the best single node of the run (`scaling_score`);
  * the model's prediction of each 2-node step
    (`tf_resnet.scaling.predict_two_nodes`), made from what is known
    before the 2-node jobs and written, with a sha256, to
    `<--out>.predictions.json` before they start; then scored, in
    efficiency points, against what they measured.
"""

import argparse
import json
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402
import emulated_cluster  # noqa: E402
import scaling_score  # noqa: E402
from network_jobs import UNSHAPED, measure_model  # noqa: E402
from network_predict import PredictionsFile  # noqa: E402
from network_report import load_report, report  # noqa: E402
from network_worker import run_worker, serve_rendezvous  # noqa: E402

from tf_resnet import scaling  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="resnet20,resnet56,resnet18")
    parser.add_argument("--network", default="10gbe",
                        choices=[*sorted(scaling.NETWORKS), UNSHAPED],
                        help="the network the links stand for; unshaped: "
                        "the links unlimited")  # fmt: skip
    parser.add_argument(
        "--latency_us", type=float, default=0.0,
        help="one-way latency the links add, microseconds seen from a GPU: "
        "each node holds what it receives s times as long (s: the model's "
        "slow-down, like the rate); 0: only the software stack's",
    )  # fmt: skip
    parser.add_argument(
        "--batch",
        default="resnet20=128,resnet56=128,resnet18=32",
        help="per process, model=batch,...",
    )
    parser.add_argument("--warmup_steps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--blocks", type=int, default=3)
    parser.add_argument("--sweep_repeats", type=int, default=5)
    parser.add_argument(
        "--rounds", type=int, default=3,
        help="jobs per row and node count; the row's step is their median",
    )  # fmt: skip
    parser.add_argument("--average_every", type=int, default=4)
    parser.add_argument("--pack_bytes", type=int, default=4 * 2**20)
    parser.add_argument(
        "--knobs", action="store_true", help="also the knobs' rows"
    )
    parser.add_argument(
        "--overlap", action="store_true",
        help="the engines that overlap their all-reduce with the backward "
        "pass, beside their one all-reduce after it and a plain Horovod "
        "script (instead of the other rows)",
    )  # fmt: skip
    parser.add_argument(
        "--bucket_sizes", default="",
        help="MiB, e.g. 1,16: the overlapping engines with these bucket "
        "sizes beside their default (instead of the other rows)",
    )  # fmt: skip
    parser.add_argument(
        "--inter_op_threads", type=int, default=1,
        help="of each synchronous job's process (its node has one core); "
        "0: a run's default (runtime.inter_op_threads)",
    )  # fmt: skip
    parser.add_argument("--only", help="engines of the rows, e.g. horovod")
    parser.add_argument("--out", default="network_scaling.json")
    parser.add_argument("--report", help="print the tables of this --out file")
    args = parser.parse_args()
    if args.report:
        print(report(*load_report(args.report)))
        return
    args.batch = {
        k: int(v) for k, v in (p.split("=") for p in args.batch.split(","))
    }
    missing = emulated_cluster.missing_programs(delay=args.latency_us > 0)
    if not shutil.which("iperf3"):
        missing.append("iperf3")
    if missing:
        sys.exit(f"network_scaling: needs {', '.join(missing)}")
    common.print_environment("Scaling on an emulated network")
    network = scaling.NETWORKS.get(args.network)  # None: unshaped.

    def log(text):
        print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr,
              flush=True)  # fmt: skip

    results = {"cpu": common.cpu_model(), "date": time.strftime("%Y-%m-%d"),
               "cores": len(os.sched_getaffinity(0)), "models": []}  # fmt: skip
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    predictions = PredictionsFile(scaling_score.predictions_path(args.out), log)
    with emulated_cluster.EmulatedCluster(5) as cluster:
        for model in args.models.split(","):
            results["models"].append(
                measure_model(cluster, model, args, network, log, predictions)
            )
            with open(args.out, "w") as stream:
                json.dump(results, stream, indent=1)
    print(report(*load_report(args.out)))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        run_worker(json.loads(sys.argv[2]))
    elif sys.argv[1:2] == ["--rendezvous"]:
        serve_rendezvous(sys.argv[2])
    else:
        main()
