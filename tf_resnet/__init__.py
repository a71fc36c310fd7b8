"""tf-resnet: ResNets on CIFAR and TinyImageNet with TensorFlow 2 / Keras 3.

Public, stable entry points:
  * `tf_resnet.models.build_model(name, num_classes, input_shape, **options)`
  * `tf_resnet.data.open_split(dataset, path, training=...)` -> `Split`,
    whose `dataset(batch_size, InputOptions(...))` is the input pipeline;
    `tf_resnet.data.DATASETS`, the facts of every dataset
"""

__version__ = "0.1.0"
