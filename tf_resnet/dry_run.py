"""`--dry_run`: what this process would run, printed instead of running it.

Under any launcher each process prints its own lines: the engine and why,
its devices and why, the replicas of one step, the per-replica and global
batch (and its micro-batches), the learning rate after scaling, the dtype
policy and the gradient all-reduce's knobs when set. Nothing is read,
built or written. The batch and the rate are the distributors' own batch
plan (`batch_plan.plan`), made from the replicas this process would run;
`tests/test_dry_run.py` holds those replicas against real distributors'.
"""

from tf_resnet import batch_plan, detect, traffic
from tf_resnet.config import engines
from tf_resnet.engines import registry, startup


def replicas(config, started):
    """`(replicas in sync, replicas per update, processes)` of one step."""
    engine = started.engine
    processes = startup.processes_in_sync(
        engine, config.distribution.worker_hosts
    )
    local = started.plan.replicas
    if engine.asynchronous:  # A step is one worker's.
        return local, local, processes
    in_sync = processes * local
    per_update = local if engine.update is registry.Update.PROCESS else in_sync
    return in_sync, per_update, processes


def report(config, started):
    """The lines `--dry_run` prints for this process.

    Raises:
      UserInputError: a global batch the replicas (or a replica's batch
        the micro-batches) cannot split, as training would. (Start-up
        checked the settings against the engine.)
    """
    dist = config.distribution
    in_sync, per_update, processes = replicas(config, started)
    engine = started.engine
    batch = batch_plan.plan(config.optim, in_sync, per_update, engine.name)
    rank, size, source = detect.local_process(dist.task_index)
    role = detect.server_job(dist.job_name)
    reason = started.reason
    if started.by_devices:
        reason = f"auto: {reason} with {started.plan.replicas} device(s)"
    return "\n".join(
        [
            f"dry run: process {rank} of {size} on this node ({source})"
            + (f", {role} task" if role else "")
            + (
                f", --task_index={dist.task_index}"
                if dist.worker_hosts or dist.ps_hosts
                else ""
            ),
            f"  engine: {engine.name} ({reason})",
            f"  devices: {started.plan.describe()} ({started.plan.why})",
            f"  replicas: {started.plan.replicas} in this process, "
            + (
                f"{processes} worker(s) updating asynchronously"
                if engine.asynchronous
                else f"{in_sync} in sync over {processes} process(es)"
            ),
            f"  batch: {batch.replica_batch} per replica, "
            f"{batch.global_batch} global, {batch.update_batch} per update"
            + batch.describe_micro_batches(),
            f"  learning rate: {batch.base_learning_rate:g} at batch "
            f"{batch_plan.REFERENCE_BATCH} -> {batch.peak_learning_rate:g} "
            f"at {batch.update_batch}",
            f"  dtype policy: {started.dtype_policy} "
            f"(--dtype={config.runtime.dtype})",
            *_all_reduce_knobs(engine, dist, config.runtime, started),
        ]
    )


def _all_reduce_knobs(engine, dist, runtime, started):
    """A line for the gradient all-reduce's knobs, when any is set.

    The buckets' count depends on the model, which a dry run does not
    build: the run's start line gives it.
    """
    knobs = []
    overlapped = engine.overlaps and dist.overlap_all_reduce
    if overlapped:
        size = traffic.bucket_bytes(dist.all_reduce_pack_bytes)
        knobs.append(
            f"buckets of about {size / 2**20:g} MiB in reverse layer order, "
            + (
                "issued together (--xla computes every gradient at once)"
                if runtime.xla
                else "each issued as the backward pass produces it"
            )
        )
        if started.inter_op_threads != runtime.inter_op_threads:
            knobs.append(
                f"{started.inter_op_threads} inter-op threads (this process "
                "has one core)"
            )
    elif engine.overlaps:
        knobs.append("one all-reduce after the backward pass")
    if dist.gradient_compression != engines.NO_COMPRESSION:
        knobs.append(f"{dist.gradient_compression} on the wire")
    if dist.all_reduce_pack_bytes and not overlapped:
        knobs.append(f"packs of {dist.all_reduce_pack_bytes} bytes")
    return [f"  gradient all-reduce: {', '.join(knobs)}"] if knobs else []
