"""Distribution modes: one class per engine, behind one interface.

Each module holds the mode of one engine (`base.DistributionMode` is the
interface the training loop talks to). The engines, and the function that
makes each one's mode, are registered in `tf_resnet.config.engines`;
`tf_resnet.modes.make_mode` makes the chosen one. Nothing here is
imported until a mode is made, so a run without Horovod never imports it.
"""
