"""Process lifetime: every process a job starts ends with the job, whatever ends it.

A job is a chain  Snakemake -> shell -> gpulab-slot -> stage script -> launcher (gpulab.forkrun
on one node, a torchrun agent per node) -> workers (or -> the spawned P2P=Disabled process).
torchrun starts its workers in sessions of their own, so a Ctrl-C on the terminal never reaches
them, and SIGKILL cannot be caught at all. Each link therefore asks the kernel to signal it when
its parent dies (``PR_SET_PDEATHSIG``), and the links that can catch signals forward them down and
reap what they started, with a bounded grace period.
"""
from __future__ import annotations

import contextlib
import ctypes
import fcntl
import logging
import os
import signal
import socket
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


TERMINATED = 128 + signal.SIGTERM  # the exit status a shell reports for a SIGTERM'd process


@contextlib.contextmanager
def sigterm_deferred():
    """A SIGTERM arriving inside the block is delivered when the block ends.

    For library calls that run their own Python worker threads (pandas 3's parallel CSV reader):
    the exception ``unwind_on_sigterm`` raises in the main thread makes such a call close its
    parsers while the workers still use them, and the process dies of a segmentation fault
    instead of removing its temporaries (measured: 1 stop in 10 under load). Delivered after the
    call, the SIGTERM unwinds as usual; a call here takes a fraction of a second."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers belong to the main thread
        return
    pending: list[int] = []
    old = signal.signal(signal.SIGTERM, lambda sig, _frame: pending.append(sig))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)
        if pending:
            signal.raise_signal(signal.SIGTERM)  # to whatever handled it before: unwind, or exit


def unwind_on_sigterm(body) -> int:
    """Run ``body()`` so that a SIGTERM (how Snakemake stops a job) unwinds it like an exception.

    The ``finally`` blocks and context managers remove the job's temporaries; a second SIGTERM
    during that cleanup is ignored so the cleanup itself is never cut short. After the unwinding
    the process leaves with ``os._exit``: native libraries' exit-time teardown (torch's thread
    pools, HDF5) is what can crash a process stopped mid-work, and there is nothing left to flush
    but the logs.
    """
    if threading.current_thread() is not threading.main_thread():
        return body()  # signal handlers belong to the main thread (a stage run in a test's thread)

    def stopped(*_):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise SystemExit(TERMINATED)

    old = signal.signal(signal.SIGTERM, stopped)
    try:
        return body()
    except SystemExit as exc:
        if exc.code != TERMINATED:
            raise
        log.warning("stopped by SIGTERM; temporaries removed")
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(TERMINATED)
    finally:
        signal.signal(signal.SIGTERM, old)


def new_group_dying_with_parent() -> None:
    """preexec_fn: own process group (signals reach it once, through the parent) + die with parent."""
    os.setpgid(0, 0)
    die_with_parent()


def stop(proc: subprocess.Popen, sig: int = signal.SIGTERM, grace: float = GRACE_S,
         group: bool = False) -> int | None:
    """Send ``sig`` to ``proc`` and every descendant (or to its process group), wait up to
    ``grace`` s, then SIGKILL what is left; reap ``proc``.

    Descendants are signalled directly because torchrun's workers sit in sessions of their own and
    a worker blocked in a collective never gets to its Python-level SIGINT handler.
    """
    try:
        import psutil

        tree = psutil.Process(proc.pid).children(recursive=True)
    except Exception:
        tree = []

    def send(s):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if group:
                os.killpg(proc.pid, s)
            else:
                os.kill(proc.pid, s)
        for child in tree:
            with contextlib.suppress(Exception):
                child.send_signal(s)

    if proc.poll() is None or tree:
        send(sig)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and (
                proc.poll() is None or any(_running(c) for c in tree)):
            time.sleep(0.05)
        send(signal.SIGKILL)
    return proc.wait()


def _running(p) -> bool:
    try:
        import psutil

        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except Exception:
        return False


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


def owner_value() -> str:
    """The value of $GPULAB_OWNER_PID that names this process as the owner of the jobs it starts."""
    return f"{socket.gethostname()}:{os.getpid()}"


def watch_owner(on_gone, poll: float = 0.5) -> threading.Thread | None:
    """Call ``on_gone()`` once when the owner process named by $GPULAB_OWNER_PID dies.

    SIGKILL of Snakemake leaves its job shells running; without this they would race the next run.
    Only an owner on this host is watched (SLURM jobs inherit the submitting host's environment);
    one that is already gone counts as gone, one that lives but is no ancestor (a task that srun
    started for it) is not watched.
    """
    host, _, raw = os.environ.get(OWNER_ENV, "").rpartition(":")
    if not raw.isdigit() or host != socket.gethostname():
        return None
    import psutil

    pid = int(raw)
    try:
        owner = psutil.Process(pid)
        if pid not in {p.pid for p in psutil.Process().parents()}:
            return None
        born = owner.create_time()
    except psutil.Error:
        on_gone()
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
