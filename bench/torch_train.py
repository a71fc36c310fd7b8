"""Trains the PyTorch twin of a CIFAR ResNet end to end on CIFAR-10 binaries.

The reference for `resnet_main.py --recipe=fast`: the network of
`torch_resnet.py` trained with the same recipe knobs, written the plain
PyTorch way, so `time_to_accuracy.py` can compare accuracy per epoch and per
second with a known-good implementation on the same machine and data.

Recipe (every knob a flag, defaults the fast recipe): SGD with Nesterov
momentum 0.9, weight decay 5e-4 on conv and linear weights only (L2 added to
the gradient, like tf_resnet's penalty), batch 128, a one-cycle rate peaking
at 0.4 (scaled linearly with the batch, as in `tf_resnet.schedules`) after
15% of the run, label smoothing 0.2, pad-4 random crop and horizontal flip,
dataset mean/std normalisation, flip test-time augmentation, optional EMA
of the weights and BatchNorm statistics. Each epoch is `N // batch` steps
over a fresh permutation (the incomplete last batch is dropped, as in
tf_resnet). Fastest CPU settings: channels-last memory, float32 (or
`--dtype=mixed_bfloat16` autocast), one thread per core.

Output: one JSON line per epoch on stdout,
  {"epoch", "step", "test_accuracy", "best_accuracy", "test_loss",
   "train_loss", "learning_rate", "train_seconds", "wall_seconds",
   "images_per_sec"}
(`train_seconds`: training steps only, cumulative; `wall_seconds`: since the
script started, including start-up and evaluation), then a summary line with
`"done": true`.

  .venv/bin/python bench/torch_train.py --epochs=30 --seed=0
"""

import argparse
import glob
import json
import math
import os
import sys
import time

import numpy as np
import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import torch_resnet  # noqa: E402

START = time.perf_counter()

RECORD_BYTES = 1 + 32 * 32 * 3
EVAL_BATCH = 500


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add = parser.add_argument
    add("--data_dir", default=common.CIFAR_DIR, help="CIFAR-10 binaries.")
    add("--model", default="resnet20")
    add("--epochs", type=int, default=30)
    add("--batch_size", type=int, default=128)
    add("--learning_rate", type=float, default=0.4, help="Peak at batch 128.")
    add("--lr_schedule", choices=("onecycle", "cosine", "step"))
    add("--warmup_epochs", type=float, help="Default: 15%% of --epochs.")
    add("--final_lr_fraction", type=float, default=0.0)
    add("--momentum", type=float, default=0.9)
    add("--nesterov", action=argparse.BooleanOptionalAction, default=True)
    add("--weight_decay", type=float, default=5e-4)
    add("--label_smoothing", type=float, default=0.2)
    add("--normalization", choices=("dataset", "per_image"), default="dataset")
    add("--eval_tta", choices=("none", "flip"), default="flip")
    add("--ema_decay", type=float, default=0.0, help="0: no EMA.")
    add("--zero_init_residual", action="store_true")
    add("--seed", type=int, default=0)
    add("--threads", type=int, default=os.cpu_count())
    add("--dtype", choices=("float32", "mixed_bfloat16"), default="float32")
    add("--layout", choices=("channels_last", "nchw"), default="channels_last")
    args = parser.parse_args(argv)
    args.lr_schedule = args.lr_schedule or "onecycle"
    if args.warmup_epochs is None:
        args.warmup_epochs = 0.15 * args.epochs
    return args


def read_cifar10(paths):
    """`(images uint8 [N, 3, 32, 32], labels int64 [N])` of binary files."""
    if not paths:
        sys.exit("no CIFAR-10 binary files found (see --data_dir)")
    chunks = []
    for path in paths:
        raw = np.fromfile(path, np.uint8)
        if raw.size == 0 or raw.size % RECORD_BYTES:
            sys.exit(
                f"{path}: {raw.size} bytes is not a whole number of "
                f"{RECORD_BYTES}-byte CIFAR-10 records"
            )
        chunks.append(raw.reshape(-1, RECORD_BYTES))
    records = np.concatenate(chunks)
    images = records[:, 1:].reshape(-1, 3, 32, 32)
    return torch.from_numpy(images.copy()), torch.from_numpy(
        records[:, 0].astype(np.int64)
    )


class Normalizer:
    """Dataset mean/std of the training images, or per-image statistics.

    `per_image` is `tf.image.per_image_standardization` (the paper recipe's);
    `dataset` uses the per-channel mean and std of the training set.
    """

    def __init__(self, kind, train_images):
        self.kind = kind
        pixels = train_images.float().div_(255.0)
        self.mean = pixels.mean(dim=(0, 2, 3), keepdim=True)
        self.std = pixels.std(dim=(0, 2, 3), keepdim=True)

    def __call__(self, images):
        x = images.float().div_(255.0)
        if self.kind == "dataset":
            return (x - self.mean) / self.std
        mean = x.mean(dim=(1, 2, 3), keepdim=True)
        floor = 1.0 / math.sqrt(x[0].numel())
        std = x.std(dim=(1, 2, 3), keepdim=True, unbiased=False)
        return (x - mean) / std.clamp_min(floor)


def pad_crop_flip(padded, generator, pad=4):
    """A random crop of each zero-padded image, mirrored with p = 1/2."""
    batch, _, height, width = padded.shape
    size_h, size_w = height - 2 * pad, width - 2 * pad
    offsets = torch.randint(0, 2 * pad + 1, (2, batch), generator=generator)
    rows = offsets[0][:, None] + torch.arange(size_h)
    cols = offsets[1][:, None] + torch.arange(size_w)
    index = torch.arange(batch)[:, None, None]
    # Advanced indexing on dims 0, 2, 3 puts channels last: [B, H, W, C].
    crops = padded[index, :, rows[:, :, None], cols[:, None, :]]
    crops = crops.permute(0, 3, 1, 2)
    flip = torch.rand(batch, generator=generator) < 0.5
    return torch.where(flip[:, None, None, None], crops.flip(3), crops)


def learning_rate_at(step, args, total_steps, warmup_steps):
    """The rate of update `step`, as `tf_resnet.schedules` defines it."""
    peak = args.learning_rate * args.batch_size / 128
    if warmup_steps and step < warmup_steps:
        ramp = peak * (step + 1) / warmup_steps
        if args.lr_schedule == "step":
            return min(ramp, peak * _step_decay(step, total_steps))
        return ramp
    if args.lr_schedule == "step":
        return peak * _step_decay(step, total_steps)
    span = max(1, total_steps - 1 - warmup_steps)
    progress = min(max((step - warmup_steps) / span, 0.0), 1.0)
    final = peak * args.final_lr_fraction
    if args.lr_schedule == "cosine":
        left = 0.5 * (1.0 + math.cos(math.pi * progress))
    else:
        left = 1.0 - progress
    return final + (peak - final) * left


def _step_decay(step, total_steps):
    return 0.1 ** sum(step >= round(f * total_steps) for f in (0.5, 0.75))


class ExponentialMovingAverage:
    """EMA of the float parameters and buffers, `tf_resnet.ema`'s rule."""

    def __init__(self, model, decay):
        self.decay = decay
        self.tensors = [
            t for t in model.state_dict().values() if t.is_floating_point()
        ]
        self.averages = [t.detach().clone() for t in self.tensors]
        self.updates = 0

    @torch.no_grad()
    def update(self):
        n = self.updates
        decay = min(self.decay, (1 + n) / (10 + n))
        torch._foreach_lerp_(self.averages, self.tensors, 1.0 - decay)
        self.updates += 1

    @torch.no_grad()
    def swap(self):
        for tensor, average in zip(self.tensors, self.averages, strict=True):
            held = tensor.clone()
            tensor.copy_(average)
            average.copy_(held)


def build_model(args):
    torch.manual_seed(args.seed)
    model = torch_resnet.build(args.model, 10)
    if args.zero_init_residual:
        for module in model.modules():
            if isinstance(module, torch_resnet.BasicBlock):
                nn.init.zeros_(module.bn2.weight)
    if args.layout == "channels_last":
        model = model.to(memory_format=torch.channels_last)
    return model


def make_optimizer(model, args):
    decayed = [p for p in model.parameters() if p.dim() > 1]
    others = [p for p in model.parameters() if p.dim() <= 1]
    return torch.optim.SGD(
        [
            {"params": decayed, "weight_decay": args.weight_decay},
            {"params": others, "weight_decay": 0.0},
        ],
        lr=args.learning_rate,
        momentum=args.momentum,
        nesterov=args.nesterov,
    )


@torch.no_grad()
def evaluate(model, images, labels, args):
    """Accuracy and mean loss over the test set (no smoothing)."""
    model.eval()
    correct, loss_sum = 0, 0.0
    for start in range(0, len(images), EVAL_BATCH):
        batch = images[start : start + EVAL_BATCH]
        target = labels[start : start + EVAL_BATCH]
        with torch.autocast("cpu", torch.bfloat16, enabled=_bf16(args)):
            logits = model(batch).float()
            if args.eval_tta == "flip":
                logits = (logits + model(batch.flip(3)).float()) / 2
        correct += int((logits.argmax(1) == target).sum())
        loss_sum += float(
            nn.functional.cross_entropy(logits, target, reduction="sum")
        )
    model.train()
    return correct / len(images), loss_sum / len(images)


def _bf16(args):
    return args.dtype == "mixed_bfloat16"


def _layout(images, args):
    if args.layout == "channels_last":
        return images.contiguous(memory_format=torch.channels_last)
    return images.contiguous()


def train(args):
    torch.set_num_threads(args.threads)
    train_images, train_labels = read_cifar10(
        sorted(glob.glob(os.path.join(args.data_dir, "data_batch*")))
    )
    test_images, test_labels = read_cifar10(
        sorted(glob.glob(os.path.join(args.data_dir, "test_batch*")))
    )
    normalize = Normalizer(args.normalization, train_images)
    test_inputs = _layout(normalize(test_images), args)
    padded = nn.functional.pad(train_images, (4, 4, 4, 4))
    generator = torch.Generator().manual_seed(args.seed)

    model = build_model(args)
    optimizer = make_optimizer(model, args)
    ema = (
        ExponentialMovingAverage(model, args.ema_decay)
        if (args.ema_decay > 0)
        else None
    )
    loss_fn = nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
    steps_per_epoch = len(train_images) // args.batch_size
    total_steps = steps_per_epoch * args.epochs
    warmup_steps = round(args.warmup_epochs * steps_per_epoch)
    model.train()
    step, train_seconds, best = 0, 0.0, 0.0
    for epoch in range(1, args.epochs + 1):
        started = time.perf_counter()
        order = torch.randperm(len(train_images), generator=generator)
        loss_total = torch.zeros(())
        for index in range(steps_per_epoch):
            chosen = order[
                index * args.batch_size : (index + 1) * args.batch_size
            ]
            images = pad_crop_flip(padded[chosen], generator)
            images = _layout(normalize(images), args)
            rate = learning_rate_at(step, args, total_steps, warmup_steps)
            for group in optimizer.param_groups:
                group["lr"] = rate
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast("cpu", torch.bfloat16, enabled=_bf16(args)):
                logits = model(images)
            loss = loss_fn(logits.float(), train_labels[chosen])
            loss.backward()
            optimizer.step()
            if ema is not None:
                ema.update()
            loss_total += loss.detach()
            step += 1
        seconds = time.perf_counter() - started
        train_seconds += seconds
        if ema is not None:
            ema.swap()
        accuracy, test_loss = evaluate(model, test_inputs, test_labels, args)
        if ema is not None:
            ema.swap()
        best = max(best, accuracy)
        emit(
            epoch=epoch,
            step=step,
            test_accuracy=round(accuracy, 6),
            best_accuracy=round(best, 6),
            test_loss=round(test_loss, 6),
            train_loss=round(float(loss_total) / steps_per_epoch, 6),
            learning_rate=rate,
            train_seconds=round(train_seconds, 3),
            wall_seconds=round(time.perf_counter() - START, 3),
            images_per_sec=round(
                steps_per_epoch * args.batch_size / seconds, 1
            ),
        )
    emit(
        done=True,
        final_accuracy=round(accuracy, 6),
        best_accuracy=round(best, 6),
        train_seconds=round(train_seconds, 3),
        wall_seconds=round(time.perf_counter() - START, 3),
        images_per_sec=round(step * args.batch_size / train_seconds, 1),
        config=vars(args),
    )


def emit(**record):
    print(json.dumps(record), flush=True)


if __name__ == "__main__":
    train(parse_args())
