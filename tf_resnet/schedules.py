"""Learning-rate schedule: linear warm-up, then step decay.

The paper's CIFAR schedule is 0.1, divided by 10 at 32k and 48k of 64k steps
at batch 128. Expressing the boundaries as fractions of the run (0.5, 0.75)
keeps that shape for any run length, and the base rate scales linearly with
the batch of one update (Goyal et al., 2017), so `--batch_size=1024` on 8
replicas trains like the paper's 128 on one.
"""

import keras
from keras import ops

REFERENCE_BATCH = 128


def scaled_learning_rate(base_learning_rate, update_batch):
    """Linear scaling rule: `base * update_batch / 128`."""
    return base_learning_rate * update_batch / REFERENCE_BATCH


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


def make_schedule(
    base_learning_rate,
    update_batch,
    total_steps,
    decay_fractions=(0.5, 0.75),
    decay_rate=0.1,
    warmup_steps=0,
):
    """The default schedule for a run of `total_steps` optimizer updates."""
    return WarmupStepDecay(
        scaled_learning_rate(base_learning_rate, update_batch),
        [round(fraction * total_steps) for fraction in decay_fractions],
        decay_rate,
        warmup_steps,
    )
