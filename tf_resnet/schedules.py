"""Learning-rate schedules: linear warm-up, then step, cosine or one-cycle.

The paper's CIFAR schedule is 0.1, divided by 10 at 32k and 48k of 64k steps
at batch 128. Expressing the boundaries as fractions of the run (0.5, 0.75)
keeps that shape for any run length; the peak is the base rate scaled to
the batch of one update (`batch_plan.BatchPlan.peak_learning_rate`).

Short runs learn more from a rate that falls continuously to (nearly) zero
by the last step than from the paper's steps, which were tuned for 64k
steps: a cosine (Loshchilov & Hutter, SGDR) or a one-cycle schedule (Smith;
the linear triangle of Page's DAWNBench CIFAR-10 entries and of PyTorch's
`OneCycleLR(anneal_strategy="linear")`). All schedules take the optimizer's
update count, 0 for the first update.
"""

import math

import keras
from keras import ops

KINDS = ("step", "cosine", "onecycle")


@keras.saving.register_keras_serializable("tf_resnet")
class WarmupStepDecay(keras.optimizers.schedules.LearningRateSchedule):
    """`peak * decay_rate**k` after k boundaries, ramped up linearly first.

    Args:
      peak: learning rate after warm-up, before any decay.
      boundaries: steps at which the rate is multiplied by `decay_rate`.
      decay_rate: factor applied at each boundary.
      warmup_steps: steps of linear ramp from `peak / warmup_steps` to `peak`.
    """

    def __init__(self, peak, boundaries, decay_rate=0.1, warmup_steps=0):
        self.peak = float(peak)
        self.boundaries = [int(b) for b in boundaries]
        self.decay_rate = float(decay_rate)
        self.warmup_steps = int(warmup_steps)

    def __call__(self, step):
        step = ops.cast(step, "float32")
        decays = sum(
            ops.cast(step >= boundary, "float32")
            for boundary in self.boundaries
        )
        rate = self.peak * ops.power(self.decay_rate, decays)
        if self.warmup_steps:
            ramp = self.peak * (step + 1.0) / self.warmup_steps
            rate = ops.where(
                step < self.warmup_steps, ops.minimum(ramp, rate), rate
            )
        return rate

    def get_config(self):
        return {
            "peak": self.peak,
            "boundaries": self.boundaries,
            "decay_rate": self.decay_rate,
            "warmup_steps": self.warmup_steps,
        }


class _WarmupAnneal(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up to `peak`, then `anneal(progress)` down to the end.

    Step `s < warmup_steps` uses `peak * (s + 1) / warmup_steps` (the ramp of
    `WarmupStepDecay`: the last warm-up step reaches the peak). After it,
    `progress = (s - warmup_steps) / (total_steps - 1 - warmup_steps)` runs
    from 0 at the first step after warm-up to 1 at the last step,
    `total_steps - 1`, whose rate is exactly `final_lr_fraction * peak`
    (when warm-up leaves two steps or more); later steps keep that rate.
    """

    def __init__(
        self, peak, total_steps, warmup_steps=0, final_lr_fraction=0.0
    ):
        if not 0 <= warmup_steps < total_steps:
            raise ValueError(
                f"warmup_steps must be in [0, total_steps={total_steps}), "
                f"got {warmup_steps}"
            )
        if not 0.0 <= final_lr_fraction <= 1.0:
            raise ValueError(
                f"final_lr_fraction must be in [0, 1], got {final_lr_fraction}"
            )
        self.peak = float(peak)
        self.total_steps = int(total_steps)
        self.warmup_steps = int(warmup_steps)
        self.final_lr_fraction = float(final_lr_fraction)

    def anneal(self, progress):
        """The fraction of `peak - final` left at `progress` in [0, 1]."""
        raise NotImplementedError

    def __call__(self, step):
        step = ops.cast(step, "float32")
        span = max(1, self.total_steps - 1 - self.warmup_steps)
        progress = ops.clip((step - self.warmup_steps) / span, 0.0, 1.0)
        final = self.peak * self.final_lr_fraction
        rate = final + (self.peak - final) * self.anneal(progress)
        if self.warmup_steps:
            ramp = self.peak * (step + 1.0) / self.warmup_steps
            rate = ops.where(step < self.warmup_steps, ramp, rate)
        return rate

    def get_config(self):
        return {
            "peak": self.peak,
            "total_steps": self.total_steps,
            "warmup_steps": self.warmup_steps,
            "final_lr_fraction": self.final_lr_fraction,
        }


@keras.saving.register_keras_serializable("tf_resnet")
class WarmupCosineDecay(_WarmupAnneal):
    """Warm-up, then half a cosine from `peak` to `final_lr_fraction * peak`.

    After warm-up the rate is `final + (peak - final) * (1 + cos(pi * p)) / 2`
    with `p` the progress of `_WarmupAnneal`: it stays near the peak early,
    falls fastest at mid-run, where it is halfway, and flattens at the end.

    Args:
      peak: rate at the end of warm-up.
      total_steps: optimizer updates of the whole run.
      warmup_steps: steps of linear ramp from `peak / warmup_steps` to `peak`.
      final_lr_fraction: rate at the last step as a fraction of `peak`.
    """

    def anneal(self, progress):
        return 0.5 * (1.0 + ops.cos(math.pi * progress))


@keras.saving.register_keras_serializable("tf_resnet")
class OneCycle(_WarmupAnneal):
    """One cycle: linear up to `peak`, linear down to the final rate.

    A triangle: `peak * (s + 1) / warmup_steps` for the `warmup_steps` first
    steps, then a straight line from `peak` (first step after warm-up) to
    `final_lr_fraction * peak` (last step, `total_steps - 1`). This is the
    schedule of Page's DAWNBench ResNets and of PyTorch's
    `OneCycleLR(anneal_strategy="linear", three_phase=False)` with a start and
    an end near zero. Momentum is not cycled (SGD keeps its constant one).

    Args:
      peak: rate at the top of the cycle.
      total_steps: optimizer updates of the whole run.
      warmup_steps: steps of the rising half (e.g. 15% of the run).
      final_lr_fraction: rate at the last step as a fraction of `peak`.
    """

    def anneal(self, progress):
        return 1.0 - progress


def make_schedule(
    peak,
    total_steps,
    decay_fractions=(0.5, 0.75),
    decay_rate=0.1,
    warmup_steps=0,
    kind="step",
    final_lr_fraction=0.0,
):
    """The schedule of a run of `total_steps` optimizer updates.

    Args:
      peak: the rate after warm-up, before any decay (the batch plan's
        `peak_learning_rate`).
      total_steps: optimizer updates of the run.
      decay_fractions: `kind="step"`: fractions of the run where it decays.
      decay_rate: `kind="step"`: factor of each decay.
      warmup_steps: steps of linear warm-up.
      kind: `"step"` (the paper's, `WarmupStepDecay`), `"cosine"`
        (`WarmupCosineDecay`) or `"onecycle"` (`OneCycle`).
      final_lr_fraction: `"cosine"`/`"onecycle"`: rate at the last step as a
        fraction of the peak.

    Returns:
      A Keras `LearningRateSchedule`.
    """
    if kind == "step":
        return WarmupStepDecay(
            peak,
            [round(fraction * total_steps) for fraction in decay_fractions],
            decay_rate,
            warmup_steps,
        )
    if kind == "cosine":
        return WarmupCosineDecay(
            peak, total_steps, warmup_steps, final_lr_fraction
        )
    if kind == "onecycle":
        return OneCycle(peak, total_steps, warmup_steps, final_lr_fraction)
    raise ValueError(
        f"learning-rate schedule must be one of {', '.join(KINDS)}: {kind!r}"
    )
