"""Distributors: one class per engine, behind one interface.

Each module holds the distributor of one engine (`base.Distributor` is the
interface the training loop talks to). The engines, and the function that
makes each one's distributor (a `Call` naming it), are registered in the
engine wing (`tf_resnet.engines.registry`);
`tf_resnet.engines.distributors.make_distributor` makes the chosen one.
Nothing here is imported until a distributor is made, so a run without
Horovod never imports it.
"""
