"""Gradient buckets: the all-reduce overlapped with the backward pass.

A backward pass computes the last layer's gradients first and the first
layer's last. One all-reduce of every gradient can start only once the
first layer's exists, when the backward pass is over (Horovod processes
a group once all its tensors exist; a concatenated pack waits for each of
its tensors). Split into buckets in reverse layer order, each bucket's
all-reduce is issued as soon as its own gradients exist and runs while
the earlier layers' gradients are still being computed, as PyTorch DDP's
buckets (arXiv 2006.15704) and a Horovod script's per-tensor all-reduces
on its background thread do.

Within one `tf.function` nothing more is needed than one all-reduce op per
bucket: the executor runs an op as soon as its inputs exist, and the
all-reduce ops of Horovod and of TensorFlow's collectives are asynchronous
kernels that leave the other threads computing. The Horovod engine calls
`all_reduce` with a grouped all-reduce per bucket; TensorFlow's
collectives already pack the Keras optimizer's all-reduce this way, so
multi_worker only sets the pack size. `tests/test_overlap.py` holds the
order from a profile of a step of each.

Both need an inter-op thread beside the one running the backward pass.
On one thread, TensorFlow's collectives start only once the backward
pass is over (none of them overlaps it), and Horovod's buckets finish
well after it; `runtime.inter_op_threads` gives a process of one core
`INTER_OP_THREADS` when its all-reduce overlaps (the profiles: the
network scaling page of bench/README.md).
"""

import math

import tensorflow as tf

from tf_resnet import traffic

# Inter-op threads an overlapped all-reduce needs: the backward pass's and
# one to start and finish the buckets' all-reduces beside it.
INTER_OP_THREADS = 2


def _nbytes(tensor):
    """Bytes of a tensor or variable (Keras' or TensorFlow's)."""
    return math.prod(tensor.shape) * tf.as_dtype(tensor.dtype).size


def plan(tensors, max_bytes):
    """The buckets of `tensors` (`traffic.bucket_plan`): lists of indices.

    `None` entries (variables without a gradient) are in none.
    """
    sizes = [None if t is None else _nbytes(t) for t in tensors]
    return traffic.bucket_plan(sizes, max_bytes)


def all_reduce(tensors, max_bytes, reduce_bucket):
    """`tensors` all-reduced one bucket at a time, the last tensors first.

    Args:
      tensors: the gradients, in the order of the model's variables
        (`None` for a variable without one, which stays `None`).
      max_bytes: the bucket size (`plan`).
      reduce_bucket: `fn(list of tensors) -> list of tensors`, the engine's
        all-reduce of one bucket, issued in bucket order.

    Returns:
      The all-reduced tensors, in the order of `tensors`.
    """
    reduced = list(tensors)
    for bucket in plan(tensors, max_bytes):
        sums = reduce_bucket([tensors[index] for index in bucket])
        for index, total in zip(bucket, sums, strict=True):
            reduced[index] = total
    return reduced


def describe(variables, max_bytes, xla=False):
    """The start line's words for the overlapped all-reduce of `variables`.

    `xla`: the forward and backward pass are one XLA computation, whose
    gradients all appear at once: the buckets then have nothing to overlap.
    """
    count = len(plan(list(variables), max_bytes))
    when = (
        "issued together: --xla computes every gradient at once"
        if xla
        else "each issued as the backward pass produces its gradients"
    )
    return f"{count} bucket(s) of about {max_bytes / 2**20:g} MiB, {when}"
