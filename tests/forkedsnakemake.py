"""`python -m snakemake` forked from a process that has already imported its libraries.

The suite starts Snakemake ~60 times, most of them dry runs of a few hundred milliseconds of work.
Each start spent ~1.5 CPU-s importing the libraries under Snakemake (pandas, SQLAlchemy, PuLP,
requests, docutils, ...) on a 2-core machine where the suite is CPU-bound. Here each worker keeps
one multiprocessing forkserver that imported those libraries once; every run is a fork of it that
then imports Snakemake and gpulab itself and runs Snakemake's own command line, in its working
directory, with its environment, its stdout and stderr in files: ~0.9 CPU-s a dry run instead of
~2.4.

What is preloaded is third-party code only, never `snakemake*` or `gpulab`: those modules keep
state taken at import (Snakemake's run directory is the working directory at import), and a fork
would carry the server's. A forked run's /proc/<pid>/environ is the server's (it never execs): the
processes it starts carry its environment, and tests that look for marked processes find those.
Runs that talk to a SLURM cluster (SLURM_CONF set) or need the fast-poll wrapper go through a real
`python -m snakemake`: the SLURM plugin reads the cluster at import.
"""
from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

# The libraries a Snakemake dry run of this workflow imports that are neither Snakemake's nor
# gpulab's (their import is what each `python -m snakemake` paid again).
PRELOAD = ["pandas", "h5py", "jsonschema", "yaml", "sqlalchemy", "sqlmodel", "pulp", "requests",
           "docutils", "jinja2", "smart_open", "pydantic", "pygments", "dateutil", "tenacity",
           "wrapt", "attr", "platformdirs", "psutil", "yte", "throttler", "referencing", "PIL"]

_context = None


def _forkserver():
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(PRELOAD)
    return _context


def usable(env: dict) -> bool:
    """Whether a run with this environment may be forked (see the module's docstring)."""
    return "SLURM_CONF" not in env


def _child(cwd: str, argv: list[str], env: dict, out: str, err: str) -> None:
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    for fd, path in ((1, out), (2, err)):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(f, fd)
        os.close(f)
    sys.argv = ["snakemake", *argv]
    code = 0
    try:
        from snakemake.cli import main

        main(argv)
    except SystemExit as e:  # as the interpreter exits: None is 0, a message goes to stderr as 1
        code = 0 if e.code is None else e.code
        if not isinstance(code, int):
            print(code, file=sys.stderr)
            code = 1
    except BaseException:  # as the interpreter would: the traceback on stderr, status 1
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


def run(cwd: Path, argv: list[str], env: dict, timeout: float) -> subprocess.CompletedProcess:
    """Snakemake's command line with ``argv`` in ``cwd``: a CompletedProcess as subprocess.run
    with capture_output=True, text=True would give (TimeoutExpired past ``timeout``)."""
    cmd = [sys.executable, "-m", "snakemake", *argv]
    with tempfile.TemporaryDirectory(prefix="gpulab-forked-snakemake-") as d:
        out, err = os.path.join(d, "stdout"), os.path.join(d, "stderr")
        p = _forkserver().Process(target=_child, args=(str(cwd), list(argv), dict(env), out, err))
        p.start()
        try:
            p.join(timeout)
        finally:  # past the timeout, or the test interrupted (pytest-timeout, Ctrl-C): as subprocess.run
            timed_out = p.exitcode is None
            if timed_out:
                p.kill()
                p.join()
        stdout, stderr = (Path(f).read_text(errors="replace") if os.path.exists(f) else "" for f in (out, err))
    if timed_out:
        raise subprocess.TimeoutExpired(cmd, timeout, stdout, stderr)
    return subprocess.CompletedProcess(cmd, p.exitcode, stdout, stderr)
