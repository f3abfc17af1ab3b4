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
SlurmctldHost={self.host}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1000
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
GresTypes=gpu
SlurmctldTimeout=30
SlurmdTimeout=30
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

    def start(self, timeout: float = 60) -> None:
        self.write_config()
        key = Path("/etc/munge/munge.key")
        if not key.exists():
            subprocess.run(["/usr/sbin/mungekey", "--create"], check=False)
        Path("/run/munge").mkdir(parents=True, exist_ok=True)
        subprocess.run(["chown", "-R", "munge:munge", "/run/munge", "/etc/munge", "/var/lib/munge",
                        "/var/log/munge"], check=False)
        if subprocess.run(["pgrep", "-x", "munged"], capture_output=True).returncode != 0:
            subprocess.run(["runuser", "-u", "munge", "--", _sbin("munged")], check=True)
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
