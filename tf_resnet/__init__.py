"""tf-resnet: ResNets on CIFAR and TinyImageNet with TensorFlow 2 / Keras 3.

Public, stable entry points:
  * `tf_resnet.models.build_model(name, num_classes, input_shape, **options)`
  * `tf_resnet.data.build_dataset(dataset, file_pattern, training,
    batch_size, **options)`
"""

__version__ = "0.1.0"
