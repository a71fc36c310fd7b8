"""Launchers: the processes of a training job, started and watched.

  python -m tf_resnet.launch.horovod --np=2 -- <resnet_main.py flags>
  python -m tf_resnet.launch.ps --num_ps=1 --num_workers=2 -- <flags>
  python -m tf_resnet.launch.tf_config_cluster --np=2 -- <flags>
  python -m tf_resnet.launch.ray --address=auto --num_workers=2 -- <flags>

The first three run every process of the job on this machine: the
launcher moves itself into a loopback-only network namespace
(`private_network`), starts the processes there (`processes`: one process
group that dies with the launcher and is stopped as a whole) and
propagates how the job ended as its exit code. `ray` is neither local nor
private: Ray Train places the workers on the nodes of an existing Ray
cluster, on its network; each worker's training process dies with its
actor as a local launcher's die with it (`processes.die_with`).

The course's Slurm and PBS jobs, whose processes the scheduler starts,
are not here: `tf_resnet.jobs`.

Which engines a launcher starts is its engines' `launcher` field
(`tf_resnet.engines.registry`).

The package imports only the standard library, absl's flags,
`tf_resnet.config` (the flag definitions of `resnet_main.py`, read as it
reads them: `cli.given_flag`) and the engine wing's registry (the
engines), all free of TensorFlow and of threads, and must stay so (a test
checks): `unshare(CLONE_NEWUSER)`, which gives a user without root its
namespace, fails in a process with more than one thread, and TensorFlow
starts threads as it is imported. `python -m tf_resnet.launch.<launcher>`
imports this package and `tf_resnet/__init__.py` only, so it is still
single-threaded when it enters the namespace.
"""
