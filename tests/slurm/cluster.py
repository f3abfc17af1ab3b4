"""A real single-node SLURM cluster (Debian's slurm-wlm + munge) started for the tests, as root.

Two fake GPUs are character devices (/dev/fakegpuN, like /dev/null): slurmd needs real device nodes
for `File=` in gres.conf, or the node goes invalid.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

NEEDED = ("slurmctld", "slurmd", "munged", "sinfo", "sbatch", "squeue", "scontrol")


def available() -> str | None:
    """None if a cluster can be started here, else the reason it cannot."""
    missing = [b for b in NEEDED if not shutil.which(b) and not Path(f"/usr/sbin/{b}").exists()]
    if missing:
        return f"SLURM not installed (missing {', '.join(missing)}; apt-get install slurm-wlm munge)"
    if os.geteuid() != 0:
        return "starting slurmctld/slurmd needs root"
    return None


# What both test clusters share: root daemons, munge, no cgroups, no accounting database.
BASE_CONF = """SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
SlurmctldTimeout=30
SlurmdTimeout=30
"""


def _sbin(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


class Cluster:
    MARK = "# written by gpulab's tests"

    def __init__(self, root: Path, gpus: int = 2, etc: Path = Path("/etc/slurm")):
        self.root, self.gpus = root, gpus
        self.host = socket.gethostname().split(".")[0]
        # Job steps (srun inside a batch job) look for the config in /etc/slurm, not $SLURM_CONF.
        self.conf = etc / "slurm.conf"
        if self.conf.exists() and self.MARK not in self.conf.read_text():
            raise RuntimeError(f"{self.conf} exists and is not ours: refusing to overwrite it")
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    def write_config(self) -> None:
        r = self.root
        for d in ("state", "spool", "log"):
            (r / d).mkdir(parents=True, exist_ok=True)
        cpus = os.cpu_count() or 2
        mem_mb = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20 * 0.8)
        self.conf.parent.mkdir(parents=True, exist_ok=True)
        self.conf.write_text(f"""{self.MARK}
ClusterName=gpulabci
{BASE_CONF}SlurmctldHost={self.host}
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd.log
DefMemPerCPU=1000
GresTypes=gpu
NodeName={self.host} CPUs={cpus} RealMemory={mem_mb} Gres=gpu:{self.gpus} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")
        lines = []
        for i in range(self.gpus):
            dev = Path(f"/dev/fakegpu{i}")
            if not dev.exists():
                subprocess.run(["mknod", str(dev), "c", "1", "3"], check=True)
            lines.append(f"Name=gpu File={dev}")
        (self.conf.parent / "gres.conf").write_text("\n".join(lines) + "\n")

    @staticmethod
    def _munge() -> None:
        """One munged for every node: its socket in /run/munge is reachable from any namespace."""
        key = Path("/etc/munge/munge.key")
        if not key.exists():
            subprocess.run(["/usr/sbin/mungekey", "--create"], check=False)
        Path("/run/munge").mkdir(parents=True, exist_ok=True)
        subprocess.run(["chown", "-R", "munge:munge", "/run/munge", "/etc/munge", "/var/lib/munge",
                        "/var/log/munge"], check=False)
        if subprocess.run(["pgrep", "-x", "munged"], capture_output=True).returncode != 0:
            subprocess.run(["runuser", "-u", "munge", "--", _sbin("munged")], check=True)

    def start(self, timeout: float = 60) -> None:
        self.write_config()
        self._munge()
        subprocess.run([_sbin("slurmctld"), "-f", str(self.conf)], env=self.env, check=True)
        subprocess.run([_sbin("slurmd"), "-f", str(self.conf)], env=self.env, check=True)
        deadline = time.time() + timeout
        while time.time() < deadline:
            p = subprocess.run(["sinfo", "-h", "-o", "%T"], env=self.env, capture_output=True, text=True)
            if p.stdout.strip() == "idle":
                return
            time.sleep(0.5)
        raise RuntimeError(f"SLURM node never became idle: {p.stdout} {p.stderr}\n{self.logs()}")

    def logs(self) -> str:
        out = []
        for f in sorted((self.root / "log").glob("*.log")):
            out.append(f"--- {f.name}\n{f.read_text()[-3000:]}")
        return "\n".join(out)

    def stop(self) -> None:
        subprocess.run(["scontrol", "shutdown"], env=self.env, capture_output=True, timeout=30)
        for pidfile in ("slurmd.pid", "slurmctld.pid"):
            p = self.root / pidfile
            if p.exists():
                try:
                    os.kill(int(p.read_text().strip()), 15)
                except (ProcessLookupError, ValueError):
                    pass
        # A config left in /etc/slurm would make every later scontrol wait for a dead controller.
        if self.conf.exists() and self.MARK in self.conf.read_text():
            self.conf.unlink()


def namespaces_allowed() -> str | None:
    """None if network + UTS namespaces can be made here, else why not (the two-node cluster's
    nodes each live in one)."""
    reason = available()
    if reason:
        return reason
    if not all(shutil.which(b) for b in ("ip", "unshare", "nsenter")):
        return "iproute2/util-linux missing (ip, unshare, nsenter): apt-get install iproute2"
    name = f"gplprobe{os.getpid()}"
    p = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True, timeout=30)
    if p.returncode != 0:
        return f"network namespaces not allowed here ({p.stderr.strip()})"
    try:
        q = subprocess.run(["nsenter", f"--net=/run/netns/{name}", "unshare", "--uts", "--mount",
                            "hostname", "probe"], capture_output=True, text=True, timeout=30)
        if q.returncode != 0:
            return f"UTS/mount namespaces not allowed here ({q.stderr.strip()})"
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
    return None


class TwoNodeCluster:
    """Two SLURM nodes on one machine, each a slurmd in its own network + UTS namespace (its own
    host name and address; a veth pair joins them), slurmctld in node 0's namespace, one munged.

    Every process of a node (daemons, their job steps, the Snakemake client run through
    :meth:`cmd`) sees /etc/netns/<ns>/{hosts,slurm} bind-mounted over /etc/hosts and /etc/slurm in
    a mount namespace of its own: this cluster's names and config, the machine's left untouched. Addresses exist only inside the two
    namespaces. :meth:`stop` removes every daemon, namespace and file it made, also after a failed
    start; use it as a context manager.
    """

    SUBNET = "10.231.77"

    def __init__(self, root: Path, nodes: int = 2):
        self.root = root
        tag = os.getpid() % 100000
        self.ns = [f"gpl{tag}n{i}" for i in range(nodes)]
        self.hosts = [f"gpulab-n{i}" for i in range(nodes)]
        self.addrs = [f"{self.SUBNET}.{i + 1}" for i in range(nodes)]
        self.veth = (f"gpl{tag}a", f"gpl{tag}b")
        self.made_etc_slurm = False
        self.made_etc_netns = not Path("/etc/netns").exists()
        self.conf = Path("/etc/slurm/slurm.conf")  # as seen inside the namespaces
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    def __enter__(self) -> "TwoNodeCluster":
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def cmd(self, node: int, argv: list[str]) -> list[str]:
        """``argv`` run as a process of node ``node``: its network, host name, /etc/hosts and
        /etc/slurm. (Not ``ip netns exec``: it remounts /sys, hiding the cgroups slurmd needs.)"""
        ns, etc = self.ns[node], Path("/etc/netns") / self.ns[node]
        setup = (f"mount --bind {etc}/hosts /etc/hosts && mount --bind {etc}/slurm /etc/slurm && "
                 f'hostname {self.hosts[node]} && exec "$@"')
        return ["nsenter", f"--net=/run/netns/{ns}", "unshare", "--mount", "--uts",
                "--propagation", "private", "sh", "-c", setup, "sh", *argv]

    def _run(self, argv: list[str], timeout: float = 30) -> None:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed: {p.stderr.strip()}")

    def _network(self) -> None:
        a, b = self.veth
        for ns in self.ns:
            self._run(["ip", "netns", "add", ns])
        self._run(["ip", "link", "add", a, "type", "veth", "peer", "name", b])
        for i, (dev, ns) in enumerate(zip(self.veth, self.ns)):
            self._run(["ip", "link", "set", dev, "netns", ns])
            self._run(["ip", "-n", ns, "addr", "add", f"{self.addrs[i]}/24", "dev", dev])
            self._run(["ip", "-n", ns, "link", "set", dev, "up"])
            self._run(["ip", "-n", ns, "link", "set", "lo", "up"])

    def _files(self) -> None:
        r = self.root
        for d in ("state", "log", *(f"spool/{h}" for h in self.hosts)):
            (r / d).mkdir(parents=True, exist_ok=True)
        if not Path("/etc/slurm").exists():  # the bind mount needs something to cover
            Path("/etc/slurm").mkdir(parents=True)
            self.made_etc_slurm = True
        cpus = os.cpu_count() or 2
        mem_mb = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20 * 0.4)
        nodes = "\n".join(f"NodeName={h} NodeHostname={h} NodeAddr={a} CPUs={cpus} "
                          f"RealMemory={mem_mb} State=UNKNOWN"
                          for h, a in zip(self.hosts, self.addrs))
        conf = f"""{Cluster.MARK}
ClusterName=gpulabci2
{BASE_CONF}SlurmctldHost={self.hosts[0]}({self.addrs[0]})
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool/%n
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd-%n.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd-%n.log
SlurmdParameters=config_overrides
DefMemPerCPU=500
KillWait=5
{nodes}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
        hosts = "127.0.0.1 localhost\n" + "".join(f"{a} {h}\n" for h, a in zip(self.hosts, self.addrs))
        for ns in self.ns:
            etc = Path("/etc/netns") / ns
            (etc / "slurm").mkdir(parents=True, exist_ok=True)
            (etc / "slurm" / "slurm.conf").write_text(conf)
            (etc / "hosts").write_text(hosts)

    def start(self, timeout: float = 60) -> None:
        self._files()
        self._network()
        Cluster._munge()
        self._run(self.cmd(0, [_sbin("slurmctld")]))
        for i, h in enumerate(self.hosts):
            self._run(self.cmd(i, [_sbin("slurmd"), "-N", h]))
        deadline = time.time() + timeout
        states = ""
        while time.time() < deadline:
            p = subprocess.run(self.cmd(0, ["sinfo", "-h", "-N", "-o", "%N %T"]), env=self.env,
                               capture_output=True, text=True, timeout=30)
            states = p.stdout + p.stderr
            if sorted(states.split()) == sorted(self.hosts + ["idle"] * len(self.hosts)):
                return
            time.sleep(0.5)
        raise RuntimeError(f"two-node SLURM cluster never became idle: {states}\n{self.logs()}")

    def logs(self) -> str:
        return Cluster.logs(self)  # type: ignore[arg-type]  # same layout under root/log

    def stop(self) -> None:
        if any(Path(f"/run/netns/{ns}").exists() for ns in self.ns[:1]):
            subprocess.run(self.cmd(0, ["scontrol", "shutdown"]), env=self.env,
                           capture_output=True, timeout=30)
        # Everything still running in our namespaces is ours: daemons, job steps, their children.
        for sig, wait in ((15, 5.0), (9, 2.0)):
            pids = []
            for ns in self.ns:
                if Path(f"/run/netns/{ns}").exists():
                    p = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True,
                                       timeout=30)
                    pids += [int(x) for x in p.stdout.split()]
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.time() + wait
            while pids and time.time() < deadline:
                pids = [p for p in pids if Path(f"/proc/{p}").exists()]
                time.sleep(0.1)
        for ns in self.ns:  # deleting a namespace deletes the veth end inside it
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
            shutil.rmtree(Path("/etc/netns") / ns, ignore_errors=True)
        subprocess.run(["ip", "link", "del", self.veth[0]], capture_output=True, timeout=30)
        for made, d in ((self.made_etc_slurm, "/etc/slurm"), (self.made_etc_netns, "/etc/netns")):
            if made:
                try:
                    Path(d).rmdir()
                except OSError:  # not empty: someone else's files are in it now
                    pass
