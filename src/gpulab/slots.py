"""Concrete GPU ids for concurrently running jobs.

Snakemake's ``--resources gpu=N`` only *counts* GPUs. A job that declares ``resources: gpu=K`` runs
its command through this module, which takes K free ids from a host-wide pool of lock files, exports
``CUDA_VISIBLE_DEVICES`` (and ``GPULAB_DEVICE_IDS`` for the result's provenance), runs the command
and releases the ids when it ends. The locks are ``flock`` locks, so the kernel drops them when the
holder dies: a crashed or killed job can never leave an id taken.

A lock is named by the GPU's physical identity (its UUID, else its PCI bus id, from NVML), not by
the id the job sees: under SLURM every job of a node sees its own GPUs as 0..k-1, so index names
would make jobs on different GPUs wait on each other, and two names for one GPU would let two jobs
share it. Only CPU virtual devices (no NVML, no nvidia-smi) are named by their index. The lock
folder is the user's own (mode 0700, checked on every claim) and lock files are never followed
through a symlink: whoever controls the folder controls every GPU slot.

    gpulab-slot --gpus 2 -- python scripts/transfer.py ...
    python -m gpulab.slots --show     # each visible id, its physical identity and its lock file
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import json
import signal
import stat
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
    """The lock folder, created 0700; an error when it is not a folder of this user's alone."""
    d = Path(os.environ.get(DIR_ENV) or f"/tmp/gpulab-slots-{os.getuid()}")
    d.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(d, 0o700)
    st = os.lstat(d)
    fix = f"remove it or set {DIR_ENV} to a folder of your own"
    if not stat.S_ISDIR(st.st_mode):
        raise SlotError(f"GPU lock folder {d} is not a folder (a symlink or a file); {fix}")
    if st.st_uid != os.getuid():
        raise SlotError(f"GPU lock folder {d} belongs to uid {st.st_uid}, not to you "
                        f"(uid {os.getuid()}): its owner could take or block every GPU slot; {fix}")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise SlotError(f"GPU lock folder {d} is writable by group or others "
                        f"(mode {stat.S_IMODE(st.st_mode):o}): anyone could plant its lock files; "
                        f"chmod 700 it, or {fix}")
    return d


def _decode(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _nvml_identities(ids: list[str]) -> dict[str, str] | None:
    """Visible id -> UUID (else PCI bus id) through NVML; None where NVML cannot start.

    NVML counts GPUs in PCI bus order, as CUDA does under CUDA_DEVICE_ORDER=PCI_BUS_ID (which
    :func:`job_env` sets), and inside a SLURM job's device cgroup it sees that job's GPUs only, so
    index i of NVML is the GPU that id i names to the job.
    """
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no driver, no library: not a GPU host for NVML
        return None
    try:
        out = {}
        for gid in ids:
            if not gid.isdigit():  # GPU-.../MIG-... UUIDs already name the device
                out[gid] = gid
                continue
            try:
                h = pynvml.nvmlDeviceGetHandleByIndex(int(gid))
            except pynvml.NVMLError:
                # Not a GPU of this host (a $GPULAB_GPU_POOL larger than the host, in tests): no
                # physical device to share, so its index is its name.
                out[gid] = gid
                continue
            try:
                out[gid] = _decode(pynvml.nvmlDeviceGetUUID(h))
            except pynvml.NVMLError:
                out[gid] = "pci-" + _decode(pynvml.nvmlDeviceGetPciInfo(h).busId)
        return out
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def _smi_identities(ids: list[str]) -> dict[str, str] | None:
    """The same from nvidia-smi where the NVML bindings are missing; None without nvidia-smi."""
    import shutil

    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return None
    by_index = dict(tuple(x.strip() for x in line.split(",", 1)) for line in out.splitlines()
                    if "," in line)
    return {g: by_index.get(g, g) for g in ids}  # as above: an id of no GPU keeps its index


def identities(ids: list[str]) -> dict[str, str]:
    """Each visible id's physical identity: a GPU UUID or PCI bus id; for CPU virtual devices (no
    NVML, no nvidia-smi) the id itself."""
    found = _nvml_identities(ids)
    if found is None:
        found = _smi_identities(ids)
    return found if found is not None else {g: g for g in ids}


def lock_name(identity: str) -> str:
    safe = "".join(c if c.isalnum() or c in "-_.:" else "_" for c in identity)
    return f"gpu-{safe}.lock"


def _try_lock(path: Path) -> int | None:
    try:
        # Never through a symlink (O_NOFOLLOW): a planted link would make us lock, and truncate,
        # a file of someone else's choosing.
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        if os.path.islink(path):
            raise SlotError(f"GPU lock {path} is a symlink (to {os.readlink(path)}); it is not "
                            "gpulab's: remove it") from None
        raise SlotError(f"cannot open GPU lock {path}: {exc}") from None
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
    names = {gid: lock_name(ident) for gid, ident in identities(ids).items()}
    try:
        while len(held) < count:
            for gid in ids:
                if gid in held or len(held) == count:
                    continue
                fd = _try_lock(d / names[gid])
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


def show() -> list[dict]:
    """Each pool id with its physical identity and lock file (``python -m gpulab.slots --show``)."""
    ids = pool_ids()
    d = lock_dir()
    return [{"id": gid, "identity": ident, "lock": str(d / lock_name(ident))}
            for gid, ident in identities(ids).items()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="gpulab-slot",
        description="Run a command holding K GPU ids of its own (exports CUDA_VISIBLE_DEVICES).",
    )
    ap.add_argument("--gpus", type=int, help="number of GPU ids to hold")
    ap.add_argument("--show", action="store_true",
                    help="print each id of the pool, its physical identity and its lock file (JSON)")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds to wait for free ids")
    ap.add_argument("cmd", nargs=argparse.REMAINDER, help="-- command and its arguments")
    args = ap.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if args.show:
        try:
            print(json.dumps(show(), indent=1))
        except SlotError as exc:
            print(f"gpulab-slot: error: {exc}", file=sys.stderr)
            return 2
        return 0
    if args.gpus is None:
        ap.error("--gpus is required")
    if not cmd:
        ap.error("no command given (put it after --)")
    try:
        return run(args.gpus, cmd, timeout=args.timeout)
    except SlotError as exc:
        print(f"gpulab-slot: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
