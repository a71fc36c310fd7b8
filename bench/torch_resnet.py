"""The CIFAR ResNets of tf_resnet, written in PyTorch for a fair baseline.

Layer for layer the architecture of `tf_resnet.models.cifar_resnet` (v1,
option-A zero-padding shortcuts) and `tf_resnet.models.course_resnet`
(projection shortcuts, dropout after the stem, global max pooling): same
kernel shapes, strides, channel counts, batch-norm momentum/epsilon and
parameter count. `bench/train_step.py` asserts that the parameter counts and
the list of weight shapes agree with the Keras model before timing anything.

Only the layout differs where each framework prefers its own: PyTorch
tensors are NCHW (optionally `channels_last` in memory), Keras NHWC.
Keras' 'same' padding of a stride-2 3x3 convolution on an even input pads
only the bottom/right; PyTorch pads one pixel on every side. Output sizes and
FLOPs are identical either way.
"""

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

# Keras momentum 0.9 keeps 90% of the old statistic; PyTorch's momentum is
# the weight of the new one.
BN_MOMENTUM = 0.1
BN_EPSILON = 1e-5


def conv3x3(in_channels, out_channels, stride=1):
    return nn.Conv2d(
        in_channels, out_channels, 3, stride=stride, padding=1, bias=False
    )


def batch_norm(channels):
    return nn.BatchNorm2d(channels, eps=BN_EPSILON, momentum=BN_MOMENTUM)


class ZeroPadShortcut(nn.Module):
    """Option A: subsample by the stride, zero-pad the extra channels."""

    def __init__(self, out_channels, stride):
        super().__init__()
        self.out_channels = out_channels
        self.stride = stride

    def forward(self, x):
        x = x[:, :, :: self.stride, :: self.stride]
        extra = self.out_channels - x.shape[1]
        return F.pad(x, (0, 0, 0, 0, extra // 2, extra - extra // 2))


class ProjectionShortcut(nn.Sequential):
    """Option B: 1x1 strided convolution and batch norm."""

    def __init__(self, in_channels, out_channels, stride):
        super().__init__(
            nn.Conv2d(in_channels, out_channels, 1, stride, bias=False),
            batch_norm(out_channels),
        )


class BasicBlock(nn.Module):
    """Two 3x3 convolutions and a residual connection (post-activation)."""

    def __init__(self, in_channels, filters, stride, shortcut):
        super().__init__()
        self.conv1 = conv3x3(in_channels, filters, stride)
        self.bn1 = batch_norm(filters)
        self.conv2 = conv3x3(filters, filters)
        self.bn2 = batch_norm(filters)
        self.shortcut = None
        if stride != 1 or in_channels != filters:
            if shortcut == "zero_pad":
                self.shortcut = ZeroPadShortcut(filters, stride)
            else:
                self.shortcut = ProjectionShortcut(in_channels, filters, stride)

    def forward(self, x):
        residual = x if self.shortcut is None else self.shortcut(x)
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + residual)


def _stages(in_channels, layout, shortcut):
    """Stages of `(filters, blocks)`; every stage but the first strides."""
    modules = []
    for index, (filters, num_blocks) in enumerate(layout):
        for block in range(num_blocks):
            stride = 2 if index > 0 and block == 0 else 1
            modules.append(BasicBlock(in_channels, filters, stride, shortcut))
            in_channels = filters
    return nn.Sequential(*modules), in_channels


class CifarResNet(nn.Module):
    """ResNet-(6n+2) v1 of He et al. section 4.2 with option-A shortcuts."""

    def __init__(self, depth, num_classes):
        super().__init__()
        n = (depth - 2) // 6
        self.stem = nn.Sequential(conv3x3(3, 16), batch_norm(16), nn.ReLU())
        layout = ((16, n), (32, n), (64, n))
        self.stages, channels = _stages(16, layout, "zero_pad")
        self.logits = nn.Linear(channels, num_classes)

    def forward(self, x):
        x = self.stages(self.stem(x))
        return self.logits(x.mean(dim=(2, 3)))


class CourseResNet(nn.Module):
    """The course network: stem with dropout, four stages, max pooling."""

    def __init__(self, num_classes, dropout_rate=0.2):
        super().__init__()
        self.stem = nn.Sequential(
            conv3x3(3, 32), batch_norm(32), nn.ReLU(), nn.Dropout(dropout_rate)
        )
        layout = ((32, 2), (64, 4), (128, 4), (256, 2))
        self.stages, channels = _stages(32, layout, "projection")
        self.logits = nn.Linear(channels, num_classes)

    def forward(self, x):
        x = self.stages(self.stem(x))
        return self.logits(x.amax(dim=(2, 3)))


def build(name, num_classes):
    """The PyTorch twin of a `tf_resnet` model name."""
    if name == "course_resnet":
        return CourseResNet(num_classes)
    if name.startswith("resnet") and name[6:].isdigit():
        return CifarResNet(int(name[6:]), num_classes)
    raise ValueError(f"no PyTorch twin for {name!r}")


def weight_shapes(model):
    """Sorted shapes of the trainable tensors, in Keras' HWIO/IO layouts.

    Conv kernels OIHW -> HWIO and dense weights OI -> IO, so the multiset of
    shapes can be compared with a Keras model's `trainable_weights`.
    """
    shapes = []
    for param in model.parameters():
        shape = tuple(param.shape)
        if len(shape) == 4:
            shape = (shape[2], shape[3], shape[1], shape[0])
        elif len(shape) == 2:
            shape = (shape[1], shape[0])
        shapes.append(shape)
    return sorted(shapes)


def count_parameters(model):
    return sum(p.numel() for p in model.parameters())


def make_train_step(
    model, learning_rate=0.1, momentum=0.9, weight_decay=1e-4, bfloat16=False
):
    """SGD with momentum and L2, the update of `tf_resnet.train_loop`.

    PyTorch's `weight_decay` adds `wd * w` to every parameter's gradient;
    tf_resnet decays conv and dense kernels only, so biases and batch-norm
    parameters go in a group without decay. `bfloat16=True` runs forward
    and loss under `torch.autocast` (PyTorch's mixed_bfloat16).
    """
    decayed = [p for p in model.parameters() if p.dim() > 1]
    others = [p for p in model.parameters() if p.dim() <= 1]
    optimizer = torch.optim.SGD(
        [
            {"params": decayed, "weight_decay": weight_decay},
            {"params": others, "weight_decay": 0.0},
        ],
        lr=learning_rate,
        momentum=momentum,
    )
    loss_fn = nn.CrossEntropyLoss()

    def train_step(images, labels):
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", torch.bfloat16, enabled=bfloat16):
            logits = model(images)
            loss = loss_fn(logits.float(), labels)
        loss.backward()
        optimizer.step()
        return loss

    return train_step
