"""The course's batch jobs: what they decide, apart from the launchers.

`scripts/course_job.sh`, sourced by the Slurm and PBS job scripts
(`scripts/slurm/`, `scripts/pbs/`, the Cray variant's `scripts/cray/`
through `scripts/cray_job.sh`), keeps in bash only what must run in the
batch shell itself: `module load`, starting and watching the training
processes, the signal traps, requeues. What a job decides and what it says
is this package, where it can be read and tested without a scheduler:

* `allocation`: the hosts and task slots of the allocation, the ports,
  the launchers' command lines (horovodrun, srun, mpirun, aprun);
* `tasks`: a task's data, weights and run directory (from the presets
  and dataset tables of `tf_resnet.config`), its checks, and the plan of
  each kind of task: the whole command line the shell runs;
* `status`: which task's exit code a failed job step ends with, what it
  means, where a stopped run resumes, the requeue of a lost task, and the
  stop of the training processes ahead of the time limit;
* `shell`: the shell's variables, its log and the error of a check;
* `cli`: the subcommands the shell calls,

    python -m tf_resnet.jobs <subcommand> [args]

  with the shell's variables in the environment (course_job.sh's function
  `batch_job` passes those the batch shell does not export). Every line it
  logs has the job's prefix `HH:MM:SS course_job: ` and goes to stderr, as
  the shell's own `log`; what the shell reads back goes to stdout, a value
  a line (paths may hold spaces, not newlines). A check that fails exits
  2, as resnet_main.py does on bad input. The variables are documented in
  course_job.sh's header, where a user reading a job script looks for
  them.

The in-process launchers (`tf_resnet.launch`) start a job's processes on
one machine or a Ray cluster; these jobs leave that to the scheduler.
The package imports the standard library and the TensorFlow-free tables
of `tf_resnet.config` only (a job makes several of these calls, one each
second while a job step runs, with `python -S`) and starts in tens of
milliseconds.
"""
