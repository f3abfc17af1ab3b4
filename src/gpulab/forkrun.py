"""One node's ranks forked from one process that imported torch once: torchrun's job on a single
node, at a fraction of its cost.

torchrun starts an agent and then a fresh interpreter per rank, and each of them imports torch:
about 1.4 CPU-seconds apiece (measured on the 2-core CI machine), which on a CPU host with 4-5
virtual devices was most of a launch. Here one process imports torch and the worker module, then
forks the ranks; no CUDA is touched before the fork (the CUDA check is NVML-based and the process
stops if CUDA was initialised anyway), so every rank initialises its own device as under torchrun.

Kept from torchrun, because the launcher's users rely on it:
- the env:// rendezvous variables (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT, GROUP_RANK);
- every rank's own stdout/stderr under ``--log-dir`` in torchrun's layout
  (``<log-dir>/<run>/attempt_0/<local rank>/stderr.log``), so :func:`gpulab.launch.rank_log_tail`
  reads both;
- the first rank to fail is named (``failure.json`` in the log dir: rank, exit code, negative for a
  signal), the others are stopped, and the exit status is 1;
- a SIGTERM or SIGINT to this process stops every rank within a grace period, then SIGKILL; each
  rank dies with this process (``PR_SET_PDEATHSIG``), so not even SIGKILL here leaves one behind.

Several nodes still go through torchrun (gpulab.launch.torchrun_cmd): rendezvous across hosts is
what it is for.

    python -m gpulab.forkrun --nproc 4 --log-dir DIR -m gpulab.gemm.worker --payload ... --out-dir ...
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import signal
import sys
import time
import traceback
import warnings
from pathlib import Path

RUN_DIR = "forkrun"  # <log-dir>/<run>/attempt_0/<rank>/: torchrun's layout, one run, one attempt
FAILURE_FILE = "failure.json"
GRACE_S = 10.0
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
STDERR_TAIL_LINES = 40


def free_port() -> int:
    """A TCP port free on this host now (the rendezvous port of a one-node launch)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def exit_description(code: int) -> str:
    """How a process ended, from its exit code (negative: killed by that signal)."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name} (exit {code})"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def rank_log_dir(log_dir: Path, local_rank: int) -> Path:
    return log_dir / RUN_DIR / "attempt_0" / str(local_rank)


def read_failure(log_dir: str | os.PathLike | None) -> dict | None:
    """The first failure a forkrun recorded in ``log_dir``: {rank, local_rank, exitcode}; None if none."""
    if not log_dir:
        return None
    f = Path(log_dir) / FAILURE_FILE
    return json.loads(f.read_text()) if f.exists() else None


def _preload(module: str, args: list[str]) -> None:
    """Import what every rank needs once, here. A module that fails to import is left to the ranks:
    each then fails with the import error in its own log, as under torchrun.

    A worker module whose ranks import more on first use (which depends on its arguments) names it
    in a ``preload(args)`` function, called here with the ranks' arguments: each such import is
    then paid once per launch instead of once per rank."""
    # torch.cuda.is_available() by NVML, not by initialising the driver, which a fork cannot inherit
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    import torch
    import torch.distributed  # noqa: F401

    with contextlib.suppress(Exception):
        mod = importlib.import_module(module)
        hook = getattr(mod, "preload", None)
        # On CUDA hosts too: the train worker's imports leave CUDA uninitialised (shown on an H100,
        # 2026-12-07); a hook that ever did would stop the launch below with its module named.
        if callable(hook):
            hook(list(args))
    if torch.cuda.is_initialized():
        raise SystemExit(f"gpulab.forkrun: importing {module} initialised CUDA; ranks forked from "
                         "here could not use it (import CUDA lazily in the worker module)")


def _run_rank(module: str, args: list[str], rank: int, nproc: int, port: int, logs: Path) -> int:
    """In the forked child: become rank ``rank`` and run ``module`` as ``__main__``."""
    import runpy

    from gpulab import lifetime

    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    lifetime.die_with_parent(signal.SIGKILL)
    d = rank_log_dir(logs, rank)
    d.mkdir(parents=True, exist_ok=True)
    for fd, name in ((1, "stdout.log"), (2, "stderr.log")):
        out = os.open(d / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(out, fd)
        os.close(out)
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(nproc),
                       "LOCAL_WORLD_SIZE": str(nproc), "GROUP_RANK": "0", "NODE_RANK": "0",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    sys.argv = [module, *args]
    code = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if not isinstance(exc.code, (int, type(None))):
            print(exc.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    return code


def _child(module, args, rank, nproc, port, logs) -> None:
    code = 1
    try:
        code = _run_rank(module, args, rank, nproc, port, logs)
    finally:
        # Never back into the parent's stack: leave here, after flushing what the rank printed.
        import logging

        with contextlib.suppress(Exception):
            logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


class _Stop(Exception):
    def __init__(self, sig: int):
        self.sig = sig


def _stop_ranks(pids: dict[int, int], grace: float) -> None:
    """SIGTERM to every live rank, SIGKILL to what is left after ``grace`` s; reaps them all."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while pids and time.monotonic() < deadline:
        pid, _ = os.waitpid(-1, os.WNOHANG)
        if pid:
            pids.pop(pid, None)
        else:
            time.sleep(0.05)
    for pid in list(pids):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
        pids.pop(pid, None)


def _stderr_tail(logs: Path, rank: int) -> str:
    f = rank_log_dir(logs, rank) / "stderr.log"
    lines = f.read_text(errors="replace").splitlines()[-STDERR_TAIL_LINES:] if f.exists() else []
    return "\n".join(f"[rank{rank}]: {line}" for line in lines)


def run(module: str, args: list[str], nproc: int, log_dir: Path, grace: float = GRACE_S) -> int:
    """Fork ``nproc`` ranks of ``module``, wait for them; 0 when every rank exits 0, else 1 (the
    first failure in ``log_dir/failure.json``), 128+signal when stopped by SIGTERM/SIGINT."""
    if nproc < 1:
        raise SystemExit(f"gpulab.forkrun: --nproc must be >= 1, got {nproc}")
    log_dir.mkdir(parents=True, exist_ok=True)
    _preload(module, args)
    port = free_port()

    def stop(sig, _frame):
        raise _Stop(sig)

    old = {s: signal.signal(s, stop) for s in STOP_SIGNALS}
    pids: dict[int, int] = {}  # pid -> rank
    failure: dict | None = None
    failed: list[int] = []
    try:
        for rank in range(nproc):
            sys.stdout.flush()
            sys.stderr.flush()
            # Blocked across the fork: a child must never run this process's stop handler (it
            # would stop its siblings); it unblocks once its own handlers are in place.
            signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
            try:
                with warnings.catch_warnings():
                    # 3.12+ warns on fork with threads; the only ones here are idle library pools
                    # (numpy, jemalloc) that no rank uses before it has its own
                    warnings.simplefilter("ignore", DeprecationWarning)
                    pid = os.fork()
                if pid == 0:
                    _child(module, args, rank, nproc, port, log_dir)
                pids[pid] = rank
            finally:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        while pids:
            pid, status = os.waitpid(-1, 0)
            rank = pids.pop(pid, None)
            if rank is None:
                continue
            code = os.waitstatus_to_exitcode(status)
            if code != 0:
                failed.append(rank)
                if failure is None:
                    failure = {"rank": rank, "local_rank": rank, "exitcode": code,
                               "time": time.time()}
                    tmp = log_dir / f".{FAILURE_FILE}.tmp"
                    tmp.write_text(json.dumps(failure))
                    os.replace(tmp, log_dir / FAILURE_FILE)
                    _stop_ranks(pids, grace)  # the others would wait for it in a collective
    except _Stop as stopped:
        for s in old:
            signal.signal(s, signal.SIG_IGN)  # a second Ctrl-C must not cut the cleanup short
        _stop_ranks(pids, grace)
        print(f"gpulab.forkrun: stopped by {signal.Signals(stopped.sig).name}; "
              f"{nproc} rank(s) of {module} ended", file=sys.stderr)
        return 128 + stopped.sig
    finally:
        for s, h in old.items():
            with contextlib.suppress(Exception):
                signal.signal(s, h)
    if failure is None:
        return 0
    print(f"gpulab.forkrun: {module}: rank {failure['rank']} failed first "
          f"({exit_description(failure['exitcode'])}); "
          f"{len(failed)} of {nproc} rank(s) failed", file=sys.stderr)
    for rank in sorted(set(failed), key=lambda r: (r != failure["rank"], r)):
        print(_stderr_tail(log_dir, rank), file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m gpulab.forkrun",
        description="Run a gpulab worker module on N ranks of this node, forked from one process "
                    "(torchrun's job on one node; see the module docstring).")
    ap.add_argument("--nproc", type=int, required=True, help="ranks on this node")
    ap.add_argument("--log-dir", type=Path, required=True,
                    help="each rank's stdout/stderr and the first failure go here")
    ap.add_argument("-m", dest="module", metavar="MODULE ...", required=True,
                    help="the worker module, run as __main__; every argument after it is its own")
    argv = sys.argv[1:] if argv is None else argv
    # as python's own -m: what follows the module is the module's, whatever it looks like
    cut = argv.index("-m") + 2 if "-m" in argv[:-1] else len(argv)
    a = ap.parse_args(argv[:cut])
    return run(a.module, argv[cut:], a.nproc, a.log_dir)


if __name__ == "__main__":
    sys.exit(main())
