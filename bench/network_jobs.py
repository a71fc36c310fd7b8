"""The driver's side of network_scaling: its rows, jobs and rounds.

A row (`Row`, listed by `rows`, chosen by `selected_rows`) is an engine
and its knobs; a job (`Job`) starts one row's processes on the emulated
cluster's nodes, as that engine's processes are started; `ModelJobs`
runs a model's jobs; `measure_model` runs its calibration and every
row's jobs in rounds, writing each round's predictions before its
2-node jobs, and `summarise` keeps what the `--out` file holds.
"""

import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time

import common
import emulated_cluster
from network_predict import gradients_of, predict_round
from network_worker import RESULT

from tf_resnet import scaling, traffic
from tf_resnet.engines import registry

# The links' rate where a job's step is to hold no network time, Mbit/s.
UNSHAPED_MBIT = 100_000
UNSHAPED = "unshaped"  # `--network`: links at that rate.
PYTHON = sys.executable
# The entry point: its `--worker` and `--rendezvous` start a job's processes.
HERE = os.path.join(common.ROOT, "bench", "network_scaling.py")
MAIN = os.path.join(common.ROOT, "resnet_main.py")


class Job:
    """The processes of one configuration, on the cluster's nodes."""

    port = 23000

    def __init__(self, cluster, spec, nodes, first_node=0):
        self.cluster = cluster
        self.spec = spec
        self.nodes = nodes
        self.first_node = first_node
        Job.port += 10

    def worker_argv(self, extra=None):
        spec = dict(self.spec, **(extra or {}))
        return [PYTHON, HERE, "--worker", json.dumps(spec)]

    def run(self, timeout=900):
        """Runs the job; returns its chief's result."""
        try:
            return self.collect(self.start(), timeout)
        finally:
            self.cluster.stop_processes()

    def start(self):
        """Starts every process; returns the chief's."""
        engine = registry.get(self.spec["flags"]["distribution"])
        env = {
            **os.environ,
            "TF_CPP_MIN_LOG_LEVEL": "2",
            "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": "1",
        }
        # The processes its transport connects, as its launcher starts them.
        return getattr(self, f"_{engine.transport.launcher}")(env)

    @staticmethod
    def collect(chief, timeout=900):
        """The result line of a started job's chief."""
        out, err = chief.communicate(timeout=timeout)
        for line in out.splitlines():
            if RESULT in line:
                return json.loads(line.split(RESULT, 1)[1])
        raise RuntimeError(f"no result:\n{out[-2000:]}\n{err[-4000:]}")

    @property
    def node_range(self):
        return range(self.first_node, self.first_node + self.nodes)

    def _spawn_worker(self, index, node, env):
        """Process `index` of the job on `node`; the first reports."""
        output = subprocess.PIPE if index == 0 else subprocess.DEVNULL
        return self.cluster.spawn(
            node,
            self.worker_argv(),
            cpus=self._cpu(node),
            env=env,
            stdout=output,
            stderr=output,
            text=True,
        )

    def _cpu(self, node):
        return node % 2

    def _horovod(self, env):
        hosts = ",".join(
            f"{self.cluster.address(n)}:1" for n in self.node_range
        )
        server = self.cluster.spawn(
            None,
            [PYTHON, HERE, "--rendezvous", hosts],
            stdout=subprocess.PIPE,
            text=True,
        )
        port = server.stdout.readline().strip()
        chief = None
        for rank, node in enumerate(self.node_range):
            rank_env = {
                **env,
                "HOROVOD_GLOO_RENDEZVOUS_ADDR": emulated_cluster.HUB_ADDRESS,
                "HOROVOD_GLOO_RENDEZVOUS_PORT": port,
                "HOROVOD_CONTROLLER": "gloo",
                "HOROVOD_CPU_OPERATIONS": "gloo",
                "HOROVOD_GLOO_IFACE": "eth0",
                "HOROVOD_HOSTNAME": self.cluster.address(node),
                "HOROVOD_RANK": str(rank),
                "HOROVOD_SIZE": str(self.nodes),
                "HOROVOD_LOCAL_RANK": "0",
                "HOROVOD_LOCAL_SIZE": "1",
                "HOROVOD_CROSS_RANK": str(rank),
                "HOROVOD_CROSS_SIZE": str(self.nodes),
            }
            process = self._spawn_worker(rank, node, rank_env)
            chief = chief or process
        return chief

    def _tf_config_cluster(self, env):
        workers = [
            f"{self.cluster.address(n)}:{self.port}" for n in self.node_range
        ]
        chief = None
        for index, node in enumerate(self.node_range):
            tf_config = {
                "cluster": {"worker": workers},
                "task": {"type": "worker", "index": index},
            }
            process = self._spawn_worker(
                index, node, {**env, "TF_CONFIG": json.dumps(tf_config)}
            )
            chief = chief or process
        return chief

    def _ps(self, env):
        """The ps and coordinator on a node of their own; a worker per node."""
        ps_node = self.cluster.nodes - 1
        ps_hosts = [f"{self.cluster.address(ps_node)}:{self.port}"]
        worker_hosts = [
            f"{self.cluster.address(n)}:{self.port + 1}"
            for n in range(self.nodes)
        ]
        cluster_flags = [
            f"--ps_hosts={','.join(ps_hosts)}",
            f"--worker_hosts={','.join(worker_hosts)}",
        ]
        # Two inter-op threads: with one, a worker's step (receives from
        # the ps beside its computation) deadlocks.
        server_flags = [
            "--intra_op_threads=1", "--inter_op_threads=2", "--dtype=float32",
        ]  # fmt: skip
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        servers = {}
        servers["ps"] = self.cluster.spawn(
            ps_node,
            [PYTHON, MAIN, "--job_name=ps", "--task_index=0", *cluster_flags,
             *server_flags],
            env=env, **quiet,
        )  # fmt: skip
        for node in range(self.nodes):
            # Not pinned: a TensorFlow worker server pinned to one core
            # (taskset -c) never finishes a step. One intra-op thread, but
            # with its two inter-op ones a worker alone computes on both
            # cores (its CPU time per update exceeds its step).
            servers[f"worker {node}"] = self.cluster.spawn(
                node,
                [PYTHON, MAIN, "--job_name=worker", f"--task_index={node}",
                 *cluster_flags, *server_flags],
                env=env, **quiet,
            )  # fmt: skip
        flags = {"ps_hosts": ps_hosts, "worker_hosts": worker_hosts}
        spec = dict(
            self.spec,
            flags={**self.spec["flags"], **flags},
            cpu_of={name: p.pid for name, p in servers.items()},
        )
        return self.cluster.spawn(
            ps_node,
            [PYTHON, HERE, "--worker", json.dumps(spec)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )


def check_link(cluster):
    """TCP goodput between two nodes (iperf3), in Mbit/s."""
    server = cluster.spawn(
        1, ["iperf3", "-s", "-1", "-B", cluster.address(1)],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    time.sleep(0.5)
    out = subprocess.run(
        cluster.command(0, ["iperf3", "-c", cluster.address(1), "-t", "3",
                            "-J"]),
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    server.wait(timeout=10)
    cluster.stop_processes()
    return json.loads(out)["end"]["sum_received"]["bits_per_second"] / 1e6


@dataclasses.dataclass(frozen=True)
class Row:
    """One configuration: an engine and its knobs, on 1 node and on 2.

    Attributes:
      name: the row's label.
      flags: `resnet_main.py` settings of the run.
      knob: whether it is a knob's row (`--knobs`) or an engine's.
      overlap: a row of the overlap comparison (`--overlap`): the one
        all-reduce after the backward pass, and the plain Horovod script.
      script: not the engine's step but this one (`tape`:
        `run_tape_script`), on the engine's processes.
      buckets: a row of another bucket size (`--bucket_sizes`).
      inter_op_threads: of each process, where not the run's
        (`--inter_op_threads`; 0: the run's).
    """

    name: str
    flags: dict
    knob: bool = False
    overlap: bool = False
    script: str = ""
    buckets: bool = False
    inter_op_threads: int = 0

    # The fields a row sets in its jobs' spec.
    SPEC_KEYS = ("script", "inter_op_threads")

    @property
    def job_spec(self):
        """What the row's jobs set in the job spec beyond the run's."""
        own = {key: getattr(self, key) for key in self.SPEC_KEYS}
        return {key: value for key, value in own.items() if value}

    @property
    def engine(self):
        return self.flags["distribution"]

    @property
    def accumulate_steps(self):
        return self.flags.get("accumulate_steps", 1)


def rows(average_every, pack_bytes, bucket_sizes=()):
    """The engines, then the knobs measured beside them.

    Read from the records of the engines that send something between
    nodes (`registry.across_nodes`), so a new one has its rows: bucket
    sizes, the one all-reduce and a second inter-op thread where it
    overlaps, fp16 where it compresses, packs where it takes them,
    `average_every` where it takes local steps, its record's scripts;
    accumulation, the training loop's and not the engine's, on the first.
    """
    sending = registry.across_nodes()
    overlapping = [e for e in sending if e.overlaps]
    packs = {"all_reduce_pack_bytes": pack_bytes}
    pack_mb = f"{pack_bytes / 2**20:g} MiB"

    def plain(engine):
        if engine.update is registry.Update.PROCESS:
            return Row(
                f"{engine.name} every {average_every}",
                {"distribution": engine.name, "average_every": average_every},
            )
        return Row(engine.name, {"distribution": engine.name})

    def scripts(engine):  # (name, script) of its step and its scripts.
        return [(engine.name, ""), *engine.scripts]

    return [
        *(
            Row(f"{engine.name}, buckets of {mib:g} MiB",
                {"distribution": engine.name,
                 "all_reduce_pack_bytes": int(mib * 2**20)},
                buckets=True)
            for engine in overlapping
            for mib in bucket_sizes
        ),
        *(plain(engine) for engine in sending),
        *(
            Row(f"{engine.name}, fp16", {"distribution": engine.name,
                                         "gradient_compression": "fp16"},
                True)
            for engine in sending if engine.compresses
        ),
        *(
            Row(f"{engine.name}, packs of {pack_mb}",
                {"distribution": engine.name, **packs}, True)
            for engine in sending if engine.packs
        ),
        *(
            Row(f"{engine.name}, accumulate 4",
                {"distribution": engine.name, "accumulate_steps": 4}, True)
            for engine in overlapping[:1]
        ),
        *(
            row
            for engine in overlapping
            for row in (
                Row(f"{engine.name}, one {engine.one_all_reduce}",
                    {"distribution": engine.name,
                     "overlap_all_reduce": False},
                    overlap=True),
                *(Row(name, {"distribution": engine.name}, overlap=True,
                      script=script)
                  for name, script in engine.scripts),
            )
        ),
        # A second inter-op thread, as TensorFlow's default gives a node
        # of more than one core: the all-reduce's ops need not wait for
        # the backward pass's on the one thread.
        *(
            Row(f"{name}, 2 inter-op threads",
                {"distribution": engine.name},
                overlap=True, script=script, inter_op_threads=2)
            for engine in overlapping
            for name, script in scripts(engine)
        ),
    ]  # fmt: skip


class ModelJobs:
    """The jobs of one model's run, on the cluster's nodes."""

    def __init__(self, cluster, model, args, log):
        self.cluster = cluster
        self.model = model
        self.args = args
        self.log = log
        self.batch = args.batch.get(model, 32)
        self.base = {
            "model": model,
            "inter_op_threads": args.inter_op_threads,
            "warmup_steps": args.warmup_steps,
            "steps": args.steps,
            "blocks": args.blocks,
        }

    def spec(self, flags, processes, extra=None):
        return {
            **self.base,
            "flags": flags,
            # Accumulation keeps each micro-batch at `batch`.
            "global_batch": self.batch
            * processes
            * flags.get("accumulate_steps", 1),
            **(extra or {}),
        }

    @staticmethod
    def described(flags, extra):
        """The flags, and what a row's own job spec adds (`Row.job_spec`)."""
        own = [f"{k}={extra[k]}" for k in Row.SPEC_KEYS if (extra or {}).get(k)]
        return f"{flags}" + (f" ({', '.join(own)})" if own else "")

    def job(self, flags, nodes, extra=None):
        processes = 1 if registry.get(flags["distribution"]).serve else nodes
        self.log(f"  {self.model} {self.described(flags, extra)} on {nodes} "
                 "node(s) ...")  # fmt: skip
        spec = self.spec(flags, processes, extra)
        if not self.cluster.delayers:
            return Job(self.cluster, spec, nodes).run()
        # What holding the packets took of the machine's cores.
        held, start = self.cluster.holding_cpu_s(), time.monotonic()
        run = Job(self.cluster, spec, nodes).run()
        run["holding_cpu_s"] = self.cluster.holding_cpu_s() - held
        run["wall_s"] = time.monotonic() - start
        dead = [p.args for p in self.cluster.delayers if p.poll() is not None]
        if dead:  # Its node received nothing more: the job is no sample.
            raise RuntimeError(f"a delayer ended during the job: {dead}")
        return run

    def twin(self, flags, extra=None):
        """Two 1-node jobs at once, one per core.

        The step of one node whose neighbour computes too, as in every
        2-node run here (two nodes of this machine share its caches and
        memory; real ones do not). A synchronous step waits for the slower
        node: its median is the row's 1-node step.
        """
        self.log(f"  {self.model} {self.described(flags, extra)} on 1 node, "
                 "twice at once ...")  # fmt: skip
        spec = self.spec(flags, 1, extra)
        jobs = [Job(self.cluster, spec, 1, n) for n in (0, 1)]
        try:
            chiefs = [j.start() for j in jobs]
            runs = [Job.collect(chief) for chief in chiefs]
        finally:
            self.cluster.stop_processes()
        slower = max(runs, key=lambda run: statistics.median(run["step_s"]))
        return {
            "step_s": slower["step_s"],
            "process_cpu_s": slower.get("process_cpu_s"),
            "inter_op_threads": slower["inter_op_threads"],
            "each_node_s": [statistics.median(r["step_s"]) for r in runs],
            "paired_s": paired_slower(
                *(run["each_step_s"] for run in runs),
                flags.get("average_every", 1),
            ),
            "slower_mean_s": max(
                statistics.fmean(run["each_step_s"]) for run in runs
            ),
        }


def calibrate(jobs, network):
    """The slow-down, the shaped link, iperf3 and the all-reduce sweeps.

    With each transport's sweep on 2 nodes, a step's all-reduces alone
    (the gradients as the engine sends them, then the metrics), the
    fastest of three, and with `--latency_us` what the delayers' holding
    costs the cores (`network_worker.holding_probe`). All before any
    row's job: what the rows' predictions may use.
    """
    cluster, model, log = jobs.cluster, jobs.model, jobs.log
    # The 1-node Horovod step sets the slow-down (no network in it).
    cluster.shape(UNSHAPED_MBIT)
    reference = jobs.job({"distribution": "horovod"}, 1)
    cpu_step = statistics.median(reference["step_s"])
    slowdown = cpu_step / (scaling.GPU_STEPS[model].ms / 1e3)
    # Unshaped: the links as fast as the machine moves bytes (the
    # all-reduce's cost in software alone).
    rate = UNSHAPED_MBIT if network is None else network.gbit * 1e3 / slowdown
    cluster.shape(rate)
    latency_us = jobs.args.latency_us
    cluster.delay(latency_us * slowdown / 1e3)
    round_trip = cluster.round_trip_ms() if latency_us else None
    goodput = check_link(cluster)
    log(f"  {model}: CPU step {1e3 * cpu_step:.0f} ms, s = {slowdown:.1f}, "
        f"link {rate:.1f} Mbit/s, iperf3 {goodput:.1f}"
        + (f", one-way delay {cluster.delay_ms:.2f} ms, ping round trip "
           f"{round_trip:.2f} ms" if latency_us else ""))  # fmt: skip
    n = reference["gradient_bytes"]
    result = {
        "model": model,
        "batch_per_process": jobs.batch,
        "bucket_bytes": traffic.DEFAULT_BUCKET_BYTES,
        "inter_op_threads": jobs.args.inter_op_threads,
        "network": UNSHAPED if network is None else network.name,
        "cpu_step_s": cpu_step,
        "slowdown": slowdown,
        "link_mbit": rate,
        "iperf3_mbit": goodput,
        "latency_us": latency_us,
        "delay_ms": cluster.delay_ms,
        "round_trip_ms": round_trip,
        "gradient_bytes": n,
        "tensors": reference["tensors"],
        "state_bytes": reference["state_bytes"],
        "sweeps": {},
        "sweep_cpu_s": {},
        "step_all_reduces_s": {},
        "holding": {},
        "rows": [],
        "prediction_sha256": [],
    }
    sizes = sorted({4096, 65536, n // 16, n // 4, n, 2 * n})
    for transport, knobs in transports(jobs.args).items():
        engine = transport.split("+")[0]
        for processes in (2, 4):
            run = jobs.job(
                {"distribution": engine, **knobs},
                processes,
                {"sweep": sizes, "sweep_repeats": jobs.args.sweep_repeats,
                 "step_all_reduces": processes == 2,
                 "delayer_pids": [p.pid for p in cluster.delayers]
                 if processes == 2 else [],
                 "steps": 1, "blocks": 1, "warmup_steps": 1},
            )  # fmt: skip
            result["sweeps"][f"{transport} {processes}"] = run["sweep"]
            result["sweep_cpu_s"][f"{transport} {processes}"] = run[
                "sweep_cpu_s"
            ]
            if processes == 2:  # One node each, as the rows' 2-node jobs.
                result["step_all_reduces_s"][transport] = min(
                    run["communication_s"]
                )
                if "holding" in run:
                    result["holding"][transport] = run["holding"]
    return result


def transports(args):
    """`{transport: flags}` of the sweeps the run's rows need."""
    wanted = args.only.split(",") if args.only else None
    needed = wanted and {registry.get(e).transport.name for e in wanted}
    swept = [e for e in registry.across_nodes() if e.overlaps]
    every = {e.transport.name: {} for e in swept}
    if args.knobs:
        fp16 = {"gradient_compression": "fp16"}
        every.update({f"{e.transport.name}+fp16": fp16 for e in swept})
    return {
        transport: knobs
        for transport, knobs in every.items()
        if not needed or transport.split("+")[0] in needed
    }


def selected_rows(args):
    """The rows of the run, as its flags choose them."""
    wanted = args.only.split(",") if args.only else None

    def chosen(row):
        if wanted and row.engine not in wanted:
            return False
        overlaps = registry.get(row.engine).overlaps
        engine_row = not (row.knob or row.overlap or row.buckets)
        if args.bucket_sizes:  # Their default bucket size, and others.
            return row.buckets or (overlaps and engine_row)
        if args.overlap:  # The engines that overlap, and their controls.
            return row.overlap or (overlaps and engine_row)
        return engine_row or (row.knob and args.knobs)

    sizes = [float(m) for m in args.bucket_sizes.split(",") if m]
    every_row = rows(args.average_every, args.pack_bytes, sizes)
    return [row for row in every_row if chosen(row)]


def single_node_jobs(jobs, row, runs, rate):
    """A row's 1-node jobs of one round, appended to `runs`.

    parameter_server's row also runs its jobs on unshaped links, on 1
    node and on 2: its step without the network (`predict_row`). They
    run here, before the round's predictions: no network, no job the
    predictions are scored against.
    """
    if not registry.get(row.engine).asynchronous:
        runs["1"].append(jobs.twin(row.flags, row.job_spec))
        return
    runs["1"].append(jobs.job(row.flags, 1))
    jobs.cluster.shape(UNSHAPED_MBIT)
    for nodes in (1, 2):
        unshaped = runs.setdefault(f"{nodes} unshaped", [])
        unshaped.append(jobs.job(row.flags, nodes))
    jobs.cluster.shape(rate)


def two_node_job(jobs, row):
    """A row's 2-node job.

    The synchronous engines' plain rows also time their step's
    all-reduces alone (`communication_alone`), and Horovod's its step
    without them (`compute_alone`).
    """
    own = row.job_spec
    plain = row.flags == {"distribution": row.engine} and not own
    ps = registry.get(row.engine).asynchronous
    extra = {"communication_alone": plain and not ps, **own}
    return jobs.job(row.flags, 2, extra)


def measure_model(cluster, model, args, network, log, predictions):
    """Every measurement of one model, as a dict (the `--out` file's).

    Rounds: every row once per round, in alternating order, so that a
    drift of the machine's speed touches all rows alike; each round's job
    is one sample of the row's step. In each round every row's 1-node jobs
    run first; then the round's predictions of every 2-node step are
    written (`predictions`, a `PredictionsFile`) and only then do the
    2-node jobs start.
    """
    jobs = ModelJobs(cluster, model, args, log)
    result = calibrate(jobs, network)
    selected = selected_rows(args)
    runs = {row.name: {"1": [], "2": []} for row in selected}
    gradients = gradients_of(model)
    for round_ in range(args.rounds):
        log(f"  {model}: round {round_ + 1} of {args.rounds}")
        order = selected if round_ % 2 == 0 else selected[::-1]
        for row in order:
            single_node_jobs(jobs, row, runs[row.name], result["link_mbit"])
        entry = predict_round(result, selected, runs, round_, gradients)
        predictions.add(entry)
        result["prediction_sha256"].append(entry["sha256"])
        for row in order:
            runs[row.name]["2"].append(two_node_job(jobs, row))
    result["rows"] = [summarise(row, runs[row.name]) for row in selected]
    return result


def summarise(row, runs):
    """A row as saved: each node count's rounds, medians and extras."""
    measured = {
        "name": row.name,
        "flags": row.flags,
        "script": row.script,
        "inter_op_threads": runs["2"][0]["inter_op_threads"],
    }
    for key, samples in runs.items():
        medians = [statistics.median(run["step_s"]) for run in samples]
        steps = [s for run in samples for s in run["step_s"]]
        measured[key] = {
            "step_s": statistics.median(medians),
            "rounds": medians,
            "range": [min(steps), max(steps)],
            "samples": steps,
            **({"each_node_s": [run["each_node_s"] for run in samples]}
               if "each_node_s" in samples[0] else {}),
            **({key: [min(run[key]) for run in samples]
                for key in ("average_s", "communication_s")
                if key in samples[0]}),
            **({"compute_s": [statistics.median(run["compute_s"])
                              for run in samples]}
               if "compute_s" in samples[0] else {}),
            **({key: [run[key] for run in samples]
                for key in ("paired_s", "slower_mean_s")}
               if "paired_s" in samples[0] else {}),
            **({"cpu_s": [run["cpu_s"] for run in samples]}
               if "cpu_s" in samples[0] else {}),
            **({"process_cpu_s": [run["process_cpu_s"]
                                  for run in samples]}
               if samples[0].get("process_cpu_s") else {}),
            **({key: [run[key] for run in samples]
                for key in ("holding_cpu_s", "wall_s")}
               if "holding_cpu_s" in samples[0] else {}),
        }  # fmt: skip
    return measured


def paired_slower(first, second, every=1):
    """The mean step of two nodes that wait for each other.

    They wait every `every` steps (averaging's period; 1: at each). Each
    node's steps as the twin jobs timed them, in runs of `every`;
    every run of one node paired with every run of the other (the nodes'
    spreads independent): the mean of the slower of each pair, per step.
    It exceeds the slower node's mean by what stragglers cost.
    """

    def runs(steps):
        return [sum(steps[i : i + every]) for i in range(0, len(steps), every)]

    return (
        statistics.fmean(max(a, b) for a in runs(first) for b in runs(second))
        / every
    )
