"""Launchers: every process of a training job on this machine, in private.

  python -m tf_resnet.launch.horovod --np=2 -- <resnet_main.py flags>
  python -m tf_resnet.launch.ps --num_ps=1 --num_workers=2 -- <flags>
  python -m tf_resnet.launch.multi_worker --np=2 -- <flags>

A launcher moves itself into a loopback-only network namespace
(`private_network`), starts the job's processes there (`processes`: one
process group that dies with the launcher and is stopped as a whole) and
propagates how the job ended as its exit code.

The package imports only the standard library, and must stay so (a test
checks): `unshare(CLONE_NEWUSER)`, which gives a user without root its
namespace, fails in a process with more than one thread, and TensorFlow
starts threads as it is imported. `python -m tf_resnet.launch.<launcher>`
imports this package and `tf_resnet/__init__.py` only, so it is still
single-threaded when it enters the namespace.
"""
