"""Concrete GPU ids for concurrently running jobs.

Snakemake's ``--resources gpu=N`` only *counts* GPUs. A job that declares ``resources: gpu=K`` runs
its command through this module, which takes K free ids from a host-wide pool of lock files, exports
``CUDA_VISIBLE_DEVICES`` (and ``GPULAB_DEVICE_IDS`` for the result's provenance), runs the command
and releases the ids when it ends. The locks are ``flock`` locks, so the kernel drops them when the
holder dies: a crashed or killed job can never leave an id taken.

    gpulab-slot --gpus 2 -- python scripts/transfer.py ...
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

from gpulab import lifetime

POOL_ENV = "GPULAB_GPU_POOL"  # comma-separated ids; overrides detection (tests, shared hosts)
DIR_ENV = "GPULAB_SLOT_DIR"
IDS_ENV = "GPULAB_DEVICE_IDS"


class SlotError(RuntimeError):
    pass


def pool_ids() -> list[str]:
    """The ids jobs may be given.

    $GPULAB_GPU_POOL if set; else $CUDA_VISIBLE_DEVICES where a scheduler (SLURM) or the user has
    already restricted the GPUs; else every physical GPU on the host.
    """
    for var in (POOL_ENV, "CUDA_VISIBLE_DEVICES"):
        env = os.environ.get(var)
        if env is not None and (var == POOL_ENV or env.strip()):
            return [s.strip() for s in env.split(",") if s.strip()]
    from gpulab.devices import physical_gpu_count

    return [str(i) for i in range(physical_gpu_count())]


def lock_dir() -> Path:
    d = Path(os.environ.get(DIR_ENV) or f"/tmp/gpulab-slots-{os.getuid()}")
    d.mkdir(parents=True, exist_ok=True)
    return d


def _try_lock(path: Path) -> int | None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


@contextlib.contextmanager
def claim(count: int, timeout: float = 3600.0, poll: float = 0.2) -> Iterator[list[str]]:
    """Hold ``count`` GPU ids exclusively for the duration of the ``with`` block."""
    ids = pool_ids()
    if count < 0:
        raise SlotError(f"cannot claim a negative number of GPUs ({count})")
    if count > len(ids):
        raise SlotError(
            f"this job asks for {count} GPU(s) but the host has {len(ids)} "
            f"(pool: {','.join(ids) or 'empty'}); lower the stage's 'gpus' setting in config.yaml"
        )
    held: dict[str, int] = {}
    deadline = time.monotonic() + timeout
    d = lock_dir()
    try:
        while len(held) < count:
            for gid in ids:
                if gid in held or len(held) == count:
                    continue
                fd = _try_lock(d / f"gpu-{gid}.lock")
                if fd is not None:
                    held[gid] = fd
            if len(held) < count:
                # Give back what we hold so two jobs waiting for 2 ids each cannot deadlock.
                for fd in held.values():
                    os.close(fd)
                held.clear()
                if time.monotonic() > deadline:
                    raise SlotError(f"no {count} free GPU ids within {timeout:.0f} s (pool {ids})")
                time.sleep(poll)
        yield sorted(held, key=ids.index)
    finally:
        for fd in held.values():
            os.close(fd)


def job_env(ids: list[str], base: dict | None = None) -> dict:
    env = dict(os.environ if base is None else base)
    # An empty CUDA_VISIBLE_DEVICES hides every GPU, so a gpu=0 job cannot disturb the others.
    env["CUDA_VISIBLE_DEVICES"] = ",".join(ids)
    # The ids are nvidia-smi's (PCI order); CUDA must count the same way to see the GPUs meant.
    # Set, not defaulted: a user's CUDA_DEVICE_ORDER=FASTEST_FIRST would silently renumber them.
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    env[IDS_ENV] = ",".join(ids)
    env.setdefault("NCCL_NVLS_ENABLE", "0")
    return env


def run(count: int, cmd: list[str], timeout: float = 3600.0) -> int:
    """Run ``cmd`` holding ``count`` ids; return its exit status (128 + signal if a signal ended it).

    The command gets a process group of its own, so a signal reaches it exactly once: through the
    handlers here, which forward it to the whole group and reap the group within a grace period.
    """
    owner_gone = threading.Event()
    # Watch before anything starts: Snakemake may die while this job waits for its ids.
    lifetime.watch_owner(owner_gone.set)
    with claim(count, timeout=timeout) as ids:
        if owner_gone.is_set():
            return 128 + signal.SIGTERM
        proc = subprocess.Popen(cmd, env=job_env(ids), preexec_fn=lifetime.new_group_dying_with_parent)
        stopping = threading.Event()

        def signal_group(sig):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, sig)

        def stop_group(signum):
            if stopping.is_set():
                return
            stopping.set()
            signal_group(signum)
            kill_later = threading.Timer(
                lifetime.GRACE_S, lambda: proc.poll() is None and signal_group(signal.SIGKILL))
            kill_later.daemon = True
            kill_later.start()

        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, lambda signum, _frame: stop_group(signum))
        threading.Thread(target=lambda: owner_gone.wait() and stop_group(signal.SIGTERM),
                         daemon=True).start()
        rc = proc.wait()
        if stopping.is_set():
            # The leader is gone; give the rest of its group (e.g. a torchrun agent stopping its
            # workers) the same grace, then kill what is left.
            deadline = time.monotonic() + lifetime.GRACE_S
            while time.monotonic() < deadline and _group_alive(proc.pid):
                time.sleep(0.1)
            signal_group(signal.SIGKILL)
        return 128 - rc if rc < 0 else rc


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="gpulab-slot",
        description="Run a command holding K GPU ids of its own (exports CUDA_VISIBLE_DEVICES).",
    )
    ap.add_argument("--gpus", type=int, required=True, help="number of GPU ids to hold")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds to wait for free ids")
    ap.add_argument("cmd", nargs=argparse.REMAINDER, help="-- command and its arguments")
    args = ap.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        ap.error("no command given (put it after --)")
    try:
        return run(args.gpus, cmd, timeout=args.timeout)
    except SlotError as exc:
        print(f"gpulab-slot: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
