"""A real two-node Slurm cluster on this machine, for the cluster tests.

Debian's `slurm-wlm` and `munge` (installed by `./setup.sh test`) run
unchanged; only the machines are stand-ins. Three network namespaces,
each with its own hostname (UTS namespace) and address on a private
bridge, stand in for a head node (`slurmctld`, where jobs are submitted)
and two compute nodes (`slurmd` and `sshd` each):

    head   10.77.0.1   bridge br0, slurmctld
    node1  10.77.0.11  eth0 (veth on br0), slurmd, sshd
    node2  10.77.0.12  eth0 (veth on br0), slurmd, sshd

No namespace has a route anywhere else, so nothing the jobs open (gRPC
servers, Horovod's rendezvous, sshd) is reachable from outside, and the
machine's own network is not touched. One `munged` on a private socket
signs Slurm's messages (a Unix socket needs no network). Every node has
the same /etc/hosts and ssh client configuration, bound over /etc by
`ip netns exec` from /etc/netns/<namespace>/, and accepts ssh as root
with a key made for the cluster, as a cluster's nodes accept each other.

Slurm runs without cgroups (`proctrack/linuxproc`, `task/none`). Each node
declares 4 GPUs that do not exist (`gres.conf`, with copies of /dev/null
for their device files), so the
scripts' `--gpus-per-node` requests are granted and Slurm sets its GPU
variables; TensorFlow sees no GPU and the jobs run on the CPU with
`--num_gpus=0`. Finished jobs are read back from Slurm's job completion
log (`jobcomp/filetxt`) and `scontrol show job`.

What it does not prove: real hosts (the nodes share one kernel, file
system and clock), real network latency, GPUs.
"""

import contextlib
import glob
import os
import pwd
import re
import shutil
import signal
import stat
import subprocess
import textwrap
import time

import pytest

SUBNET = "10.77.0"
HEAD = ("head", f"{SUBNET}.1")
NODES = (("node1", f"{SUBNET}.11"), ("node2", f"{SUBNET}.12"))
CPUS_PER_NODE = 32  # What the scripts ask for; Slurm believes it.
GPUS_PER_NODE = 4
FINAL_STATES = (
    "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
)  # fmt: skip
ETC_FILES = ("hosts", "hostname", "ssh")  # Each node's own, over /etc.
PMIX_TMP = "pmix"  # Each node's own, under the cluster's folder.

# The jobs the cluster tests submit: small (a few steps of a small model)
# through the scripts' EXTRA_FLAGS, waited for at most JOB_TIMEOUT seconds.
SMALL = (
    "--model=resnet20 --train_steps=2 --batch_size=8 --log_every_steps=1 "
    "--eval_batch_count=1"
)
JOB_TIMEOUT = 600

# Long enough that the requeue lands mid-run. A checkpoint every 7 steps:
# synchronous processes agree on a stop every 10 steps
# (PEERS_STOP_CHECK_EVERY_STEPS), so the requeued job resumes from the
# stop's own checkpoint, not from a periodic one.
REQUEUE_FLAGS = (
    "--model=resnet20 --batch_size=8 --train_steps=60 --log_every_steps=1 "
    "--checkpoint_every_steps=7 --eval_every_steps=1000 --eval_batch_count=1 "
    "--dtype=float32"
)


def missing_programs():
    """The programs the cluster needs that this machine lacks."""
    needed = ("munged", "slurmctld", "slurmd", "sbatch", "sshd", "ip")
    return [name for name in needed if not _which(name)]


def _which(name):
    return shutil.which(name, path=os.environ["PATH"] + ":/usr/sbin:/sbin")


def _run(*command, check=True, **kwargs):
    return subprocess.run(
        command, check=check, capture_output=True, text=True, **kwargs
    )


class SlurmCluster:
    """Starts, uses and tears down the cluster; see the module docstring.

    Args:
      root: an empty directory for the cluster's configuration, state,
        logs and keys.
    """

    def __init__(self, root):
        self.root = str(root)
        self.tag = f"tfr{os.getpid()}"
        self.conf = os.path.join(self.root, "slurm.conf")
        self.jobcomp = os.path.join(self.root, "jobcomp.log")
        # The jobs' scratch files (a killed worker leaves its own behind)
        # stay in the cluster's folder, not in the machine's /tmp.
        self.env = {
            **os.environ,
            "TMPDIR": os.path.join(self.root, "tmp"),
            "SLURM_CONF": self.conf,
            "PATH": os.environ["PATH"] + ":/usr/sbin:/sbin",
        }
        self._daemons = []

    def namespace(self, host):
        return f"{self.tag}-{host}"

    # Set-up -------------------------------------------------------------

    def start(self, timeout=60):
        """Starts munged, slurmctld and both nodes; waits for them IDLE."""
        try:
            self._write_files()
            self._make_network()
            self._start_munge()
            self._start_on("head", ["slurmctld", "-D", "-f", self.conf])
            for host, _ in NODES:
                self.start_node(host)
            self._wait_until_idle(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _write_files(self):
        folders = (
            "state",
            "log",
            "ssh",
            "munge",
            "tmp",
            "spool/node1",
            "spool/node2",
        )
        for sub in folders:
            os.makedirs(os.path.join(self.root, sub), exist_ok=True)
        # PMIx's client folders (`srun --mpi=pmix`) are named by job and
        # step under one base, /tmp by default: nodes that share a file
        # system would collide, so each node has its own, bound over
        # PMIX_TMP in its mount namespace (`on`).
        os.makedirs(os.path.join(self.root, PMIX_TMP), exist_ok=True)
        for host, _ in (HEAD, *NODES):
            folder = os.path.join(self.root, "nodes", host)
            os.makedirs(folder, exist_ok=True)
            os.chmod(folder, 0o1777)
        os.chmod(os.path.join(self.root, "munge"), 0o755)
        # Jobs of plain users (`as_user`) read the configuration and write
        # their scratch files here.
        os.chmod(self.root, 0o755)
        os.chmod(os.path.join(self.root, "tmp"), 0o1777)
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's own.
        nodes = "\n".join(
            f"NodeName={host} NodeAddr={address} CPUs={CPUS_PER_NODE} "
            f"Gres=gpu:{GPUS_PER_NODE} State=UNKNOWN"
            for host, address in NODES
        )
        root = self.root
        _write(
            self.conf,
            f"""
            ClusterName=tfresnet
            SlurmctldHost={HEAD[0]}({HEAD[1]})
            SlurmUser=root
            SlurmdUser=root
            AuthType=auth/munge
            CredType=cred/munge
            AuthInfo=socket={root}/munge/munge.socket,cred_expire=10
            StateSaveLocation={root}/state
            SlurmdSpoolDir={root}/spool/%n
            SlurmctldPidFile={root}/slurmctld.pid
            SlurmdPidFile={root}/slurmd-%n.pid
            SlurmctldLogFile={root}/log/slurmctld.log
            SlurmdLogFile={root}/log/slurmd-%n.log
            PlugStackConfig={root}/plugstack.conf
            ProctrackType=proctrack/linuxproc
            TaskPlugin=task/none
            JobAcctGatherType=jobacct_gather/none
            AccountingStorageType=accounting_storage/none
            JobCompType=jobcomp/filetxt
            JobCompLoc={self.jobcomp}
            MpiDefault=none
            SwitchType=switch/none
            SchedulerType=sched/backfill
            SelectType=select/cons_tres
            SelectTypeParameters=CR_CPU
            GresTypes=gpu
            SlurmdParameters=config_overrides
            ReturnToService=2
            KillWait=30
            MinJobAge=3600
            SlurmctldTimeout=30
            SlurmdTimeout=60
            {nodes}
            PartitionName=batch Nodes=ALL Default=YES MaxTime=INFINITE State=UP
            """,
        )
        # Slurm drops a GPU without a device file; /dev/null's numbers.
        devices = []
        for index in range(GPUS_PER_NODE):
            device = os.path.join(root, "dev", f"gpu{index}")
            os.makedirs(os.path.dirname(device), exist_ok=True)
            if not os.path.exists(device):
                os.mknod(device, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
            devices.append(device)
        _write(
            os.path.join(root, "gres.conf"),
            "".join(f"Name=gpu File={device}\n" for device in devices),
        )
        _write(os.path.join(root, "plugstack.conf"), "")
        _write(
            os.path.join(root, "mpi.conf"),
            f"PMIxCliTmpDirBase={root}/{PMIX_TMP}\n",
        )
        key = os.path.join(root, "ssh", "id_ed25519")
        if not os.path.exists(key):
            _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", key)
            _run(
                "ssh-keygen", "-q", "-t", "ed25519", "-N", "",
                "-f", os.path.join(root, "ssh", "host_key"),
            )  # fmt: skip
        shutil.copy(key + ".pub", os.path.join(root, "ssh", "authorized_keys"))
        hosts = "127.0.0.1 localhost\n" + "".join(
            f"{address} {host}\n" for host, address in (HEAD, *NODES)
        )
        keys = os.path.join(root, "ssh", "authorized_keys")
        for host, _ in (HEAD, *NODES):
            etc = f"/etc/netns/{self.namespace(host)}"
            os.makedirs(os.path.join(etc, "ssh"), exist_ok=True)
            _write(os.path.join(etc, "hosts"), hosts)
            _write(os.path.join(etc, "hostname"), host + "\n")
            _write(
                os.path.join(etc, "ssh", "ssh_config"),
                f"""
                Host *
                  StrictHostKeyChecking no
                  UserKnownHostsFile /dev/null
                  LogLevel ERROR
                  BatchMode yes
                Match localuser root
                  IdentityFile {key}
                """,
            )
            _write(
                os.path.join(etc, "ssh", "sshd_config"),
                f"""
                HostKey {root}/ssh/host_key
                AuthorizedKeysFile {keys} .ssh/authorized_keys
                PermitRootLogin prohibit-password
                PasswordAuthentication no
                KbdInteractiveAuthentication no
                UsePAM no
                StrictModes no
                PidFile none
                AcceptEnv *
                """,
            )

    def _make_network(self):
        head = self.namespace("head")
        for host, _ in (HEAD, *NODES):
            _run("ip", "netns", "add", self.namespace(host))
            _run("ip", "-n", self.namespace(host), "link", "set", "lo", "up")
        _run("ip", "-n", head, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", head, "addr", "add", f"{HEAD[1]}/24", "dev", "br0")
        _run("ip", "-n", head, "link", "set", "br0", "up")
        for host, address in NODES:
            node = self.namespace(host)
            _run(
                "ip", "-n", head, "link", "add", f"to-{host}", "type", "veth",
                "peer", "name", "eth0", "netns", node,
            )  # fmt: skip
            _run("ip", "-n", head, "link", "set", f"to-{host}", "master", "br0")
            _run("ip", "-n", head, "link", "set", f"to-{host}", "up")
            _run(
                "ip", "-n", node, "addr", "add", f"{address}/24", "dev", "eth0"
            )
            _run("ip", "-n", node, "link", "set", "eth0", "up")

    def _start_munge(self):
        munge = os.path.join(self.root, "munge")
        key = os.path.join(munge, "munge.key")
        with open(key, "wb") as stream:
            stream.write(os.urandom(1024))
        os.chmod(key, 0o600)
        self._spawn(
            [
                _which("munged"), "--foreground", "--force",
                f"--socket={munge}/munge.socket", f"--key-file={key}",
                f"--pid-file={munge}/munged.pid",
                f"--log-file={self.root}/log/munged.log",
                f"--seed-file={munge}/munged.seed",
            ],
            "munged",
        )  # fmt: skip
        _wait_for(lambda: os.path.exists(f"{munge}/munge.socket"), 20, "munged")

    def _start_on(self, host, command):
        """Runs a daemon on `host`: its namespace, hostname and /etc."""
        self._spawn(
            self.on(host, command), f"{os.path.basename(command[0])}@{host}"
        )

    def on(self, host, command):
        """The command line that runs `command` on `host`.

        Not `ip netns exec`, which mounts a new /sys without the cgroup
        file systems that slurmd reads: the node's network namespace, a
        mount namespace of its own with /etc/netns/<namespace>/* bound over
        /etc, and a UTS namespace with the node's hostname.
        """
        etc = f"/etc/netns/{self.namespace(host)}"
        binds = " && ".join(
            [f"mount --bind {etc}/{name} /etc/{name}" for name in ETC_FILES]
            + [f"mount --bind {self.root}/nodes/{host} {self.root}/{PMIX_TMP}"]
        )
        return [
            "nsenter", f"--net=/run/netns/{self.namespace(host)}",
            "unshare", "--uts", "--mount", "--propagation", "slave",
            "sh", "-c", f'hostname {host} && {binds} && exec "$@"', "sh",
            *command,
        ]  # fmt: skip

    def _spawn(self, command, name):
        log = open(os.path.join(self.root, "log", f"{name}.out"), "w")  # noqa: SIM115
        process = subprocess.Popen(
            command, env=self.env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        log.close()
        self._daemons.append(process)
        time.sleep(0.2)
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited: {self.logs()}")

    def _wait_until_idle(self, timeout):
        def idle():
            result = self.run(["sinfo", "-h", "-N", "-o", "%N %T"], check=False)
            states = dict(
                line.split() for line in result.stdout.splitlines() if line
            )
            return sorted(states) == ["node1", "node2"] and all(
                state == "idle" for state in states.values()
            )

        _wait_for(idle, timeout, f"both nodes idle\n{self.logs()}")

    # Use ----------------------------------------------------------------

    def run(self, command, host="head", check=True, **kwargs):
        """Runs a command on `host`: by default a client command (sbatch,
        scontrol...) on the head node."""
        return _run(
            *self.on(host, command), check=check, env=self.env, **kwargs
        )

    def sbatch(self, script, cwd, env=(), args=(), user=None):
        """Submits `script` from `cwd` as a user would; returns the job id.

        As root, or as the plain `user` (`as_user`)."""
        command = ["env", *[f"{k}={v}" for k, v in dict(env).items()],
                   "sbatch", "--parsable", *args, script]  # fmt: skip
        if user:
            command = as_user(user, command)
        result = self.run(command, cwd=cwd)
        return result.stdout.strip().split(";")[0]

    def kill_node(self, host):
        """Kills every process on `host`: the jobs' tasks, slurmd, sshd; as
        a node that crashes. `start_node` brings its daemons back."""
        pids = _run("ip", "netns", "pids", self.namespace(host), check=False)
        for pid in pids.stdout.split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)

    def daemon_pid(self, host, name):
        """The pid of the process `name` (its /proc comm, e.g. slurmd) on
        `host`, or None."""
        pids = _run("ip", "netns", "pids", self.namespace(host), check=False)
        for pid in pids.stdout.split():
            with (
                contextlib.suppress(OSError),
                open(f"/proc/{pid}/comm") as stream,
            ):
                if stream.read().strip() == name:
                    return int(pid)
        return None

    def start_node(self, host):
        """Starts a compute node's sshd and slurmd (again, after
        `kill_node`)."""
        self._start_on(
            host, ["/usr/sbin/sshd", "-D", "-f", "/etc/ssh/sshd_config"]
        )
        self._start_on(host, ["slurmd", "-D", "-f", self.conf])

    def wait_for_node(self, host, states, timeout):
        """Waits for `host` to be in one of `states` (`scontrol show
        node`'s State, e.g. IDLE: its own part of every job ended)."""
        seen = [""]

        def there():
            record = self.run(["scontrol", "-o", "show", "node", host]).stdout
            seen.append(re.search(r"\bState=(\S*)", record)[1])
            return seen[-1] in states

        try:
            _wait_for(there, timeout, f"{host} in {states}")
        except TimeoutError as error:
            raise TimeoutError(f"{error}; last {seen[-1]!r}") from None

    def job(self, job_id):
        """`scontrol show job` as a dict (empty once Slurm forgot the job)."""
        result = self.run(
            ["scontrol", "-o", "show", "job", str(job_id)], check=False
        )
        return dict(re.findall(r"(\w+)=(\S*)", result.stdout))

    def wait(self, job_id, timeout, states=FINAL_STATES):
        """Waits for the job to reach one of `states`; returns its record."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            record = self.job(job_id)
            if record.get("JobState") in states:
                return record
            time.sleep(1)
        raise TimeoutError(f"job {job_id} still {self.job(job_id)}")

    def completions(self, job_id):
        """The job's lines of the job completion log, as dicts, in order."""
        if not os.path.exists(self.jobcomp):
            return []
        with open(self.jobcomp) as stream:
            lines = stream.readlines()
        records = [dict(re.findall(r"(\w+)=(\S*)", line)) for line in lines]
        return [r for r in records if r.get("JobId") == str(job_id)]

    def logs(self):
        """The daemons' logs' tails, for a failure message."""
        parts = []
        folder = os.path.join(self.root, "log")
        for name in sorted(os.listdir(folder)):
            with open(os.path.join(folder, name), errors="replace") as stream:
                tail = stream.read()[-1500:]
            parts.append(f"--- {name}\n{tail}")
        return "\n".join(parts)

    # Tear-down ----------------------------------------------------------

    def stop(self):
        """Kills everything the cluster and its jobs run; removes it all."""
        for host, _ in NODES + (HEAD,):
            self.kill_node(host)
        for process in self._daemons:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(10)
        for host, _ in (HEAD, *NODES):
            _run("ip", "netns", "del", self.namespace(host), check=False)
            shutil.rmtree(f"/etc/netns/{self.namespace(host)}", True)


def as_user(user, command):
    """`command` run as the plain `user`, with its own HOME (runuser)."""
    return [
        _which("runuser") or "runuser", "-u", user, "--", "env",
        f"HOME={user_home(user)}", f"USER={user}", f"LOGNAME={user}", *command,
    ]  # fmt: skip


def user_home(user):
    """The home directory of `user`."""
    return pwd.getpwnam(user).pw_dir


def _write(path, text):
    with open(path, "w") as stream:
        stream.write(textwrap.dedent(text).lstrip())


def _wait_for(ready, timeout, what):
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up waiting for {what}")
        time.sleep(0.5)


def output_of(home):
    """The job's output files (Slurm writes them in the submit dir)."""
    text = ""
    for path in sorted(glob.glob(os.path.join(home, "*.out"))) + sorted(
        glob.glob(os.path.join(home, "*.err"))
    ):
        with open(path, errors="replace") as stream:
            text += stream.read()
    return text


def wait_for_output(home, pattern, timeout=300):
    """Waits until the job output in `home` matches `pattern`; fails the
    test with the output's tail if it does not within `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if re.search(pattern, output_of(home)):
            return
        time.sleep(0.5)
    text = output_of(home)[-4000:]
    pytest.fail(f"no {pattern!r} in the job's output:\n{text}")
