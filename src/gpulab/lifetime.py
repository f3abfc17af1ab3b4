"""Process lifetime: every process a job starts ends with the job, whatever ends it.

A job is a chain  Snakemake -> shell -> gpulab-slot -> stage script -> torchrun agent -> workers
(or -> the spawned P2P=Disabled process). torchrun starts its workers in sessions of their own, so a
Ctrl-C on the terminal never reaches them, and SIGKILL cannot be caught at all. Each link therefore
asks the kernel to signal it when its parent dies (``PR_SET_PDEATHSIG``), and the links that can
catch signals forward them down and reap what they started, with a bounded grace period.
"""
from __future__ import annotations

import contextlib
import ctypes
import fcntl
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

log = logging.getLogger("gpulab.lifetime")

OWNER_ENV = "GPULAB_OWNER_PID"  # the Snakemake process a job belongs to (set in common.smk)
PR_SET_PDEATHSIG = 1
GRACE_S = 10.0


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Have the kernel send ``sig`` to this process when its parent dies (Linux; else no-op).

    Usable as a ``preexec_fn`` or as a ProcessPoolExecutor initializer.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):
        return
    # The parent may have died before prctl took effect; then nobody would ever signal us.
    if os.getppid() == 1:
        os.kill(os.getpid(), sig)


def new_group_dying_with_parent() -> None:
    """preexec_fn: own process group (signals reach it once, through the parent) + die with parent."""
    os.setpgid(0, 0)
    die_with_parent()


def stop(proc: subprocess.Popen, sig: int = signal.SIGTERM, grace: float = GRACE_S,
         group: bool = False) -> int | None:
    """Send ``sig`` to ``proc`` (or its process group), wait ``grace`` s, then SIGKILL; reap it."""
    def send(s):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if group:
                os.killpg(proc.pid, s)
            else:
                os.kill(proc.pid, s)

    if proc.poll() is None:
        send(sig)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            send(signal.SIGKILL)
    if group:
        send(signal.SIGKILL)  # stragglers of the group once its leader is gone
    return proc.wait()


@contextlib.contextmanager
def sigint_ignored():
    """No second KeyboardInterrupt while a cleanup runs (Ctrl-C reaches a process group twice)."""
    main = threading.current_thread() is threading.main_thread()
    old = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
    try:
        yield
    finally:
        if main:
            signal.signal(signal.SIGINT, old)


def owner_pid() -> int | None:
    """The Snakemake process this job belongs to, if it is one of our ancestors on this host."""
    raw = os.environ.get(OWNER_ENV, "")
    if not raw.isdigit():
        return None
    pid = int(raw)
    try:
        import psutil

        # SLURM jobs inherit the submitting host's environment: only an ancestor counts.
        if pid not in {p.pid for p in psutil.Process().parents()}:
            return None
    except Exception:
        return None
    return pid


def watch_owner(on_gone, pid: int | None = None, poll: float = 0.5) -> threading.Thread | None:
    """Call ``on_gone()`` once when the owner process (default: :func:`owner_pid`) dies.

    SIGKILL of Snakemake leaves its job shells running; without this they would race the next run.
    """
    pid = owner_pid() if pid is None else pid
    if pid is None:
        return None
    import psutil

    try:
        born = psutil.Process(pid).create_time()
    except psutil.Error:
        return None

    def alive() -> bool:
        try:
            p = psutil.Process(pid)
            return p.create_time() == born and p.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    def loop():
        while alive():
            time.sleep(poll)
        log.warning("owner process %d is gone: stopping this job", pid)
        on_gone()

    t = threading.Thread(target=loop, name="gpulab-owner-watch", daemon=True)
    t.start()
    return t


_RUN_LOCK_FD: int | None = None


def clear_stale_snakemake_locks(workdir: str | Path = ".") -> list[Path]:
    """Remove Snakemake's directory locks when no gpulab Snakemake process runs in ``workdir``.

    Snakemake cannot tell a killed run's locks from a live run's, so after SIGKILL every later run
    stops with 'Directory cannot be locked'. Each run holds a kernel lock (``flock``, released on any
    death) for its whole life; whoever gets it knows that the locks on disk belong to a dead run.
    """
    global _RUN_LOCK_FD
    meta = Path(workdir) / ".snakemake"
    meta.mkdir(parents=True, exist_ok=True)
    if _RUN_LOCK_FD is not None:
        return []  # this process already checked; the locks now on disk may be its own
    fd = os.open(meta / "gpulab-run.lock", os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return []  # another run is alive here: its locks are real
    _RUN_LOCK_FD = fd
    stale = sorted((meta / "locks").glob("*.lock")) if (meta / "locks").is_dir() else []
    for f in stale:
        with contextlib.suppress(FileNotFoundError):
            f.unlink()
    return stale
