"""tf-resnet: ResNets on CIFAR and TinyImageNet with TensorFlow 2 / Keras 3.

Public, stable entry points:
  * `tf_resnet.models.build_model(name, num_classes, input_shape, **options)`
  * `tf_resnet.data.open_split(dataset, path, training=...)` -> `Split`,
    whose `dataset(batch_size, InputOptions(...))` is the input pipeline;
    `tf_resnet.data.DATASETS`, the facts of every dataset
"""

import os

__version__ = "0.1.0"

# TensorFlow's x86 wheels turn their oneDNN kernels on by default only on
# CPUs with AVX-512 VNNI/BF16 or AMX; on the others (AVX2-only Xeons and
# EPYCs) convolutions and batch norm run on Eigen's, about half as fast for
# these networks (bench/results/train_step.md, "What each change moved").
# TensorFlow reads the variable as it is imported, so this package must be
# imported first: entry points do `import tf_resnet` before
# `import tensorflow`.
# An explicit value wins.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
