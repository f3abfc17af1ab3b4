"""Shared fixtures: a private copy of the workflow to run Snakemake in, and helpers to run it."""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

import forkedsnakemake

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures"
WORKFLOW_PARTS = ["Snakefile", "config.yaml", "profiles", "workflow", "scripts", "src"]


def _ctrl_c_as_in_a_terminal() -> None:
    """A suite started in the background (`make test &`, some CI runners) inherits SIGINT ignored,
    and every process a test starts would too: Ctrl-C tests would then time a process that ignores
    Ctrl-C (torchrun's 30 s grace) instead of a terminal's foreground job. Handlers reset to the
    default at exec; an ignored signal stays ignored, so the suite undoes it once, here."""
    import signal

    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_configure(config):
    """Every Snakemake start imports the SLURM executor plugin, which asks ``scontrol show config``
    for the cluster's MinJobAge. On a machine with the SLURM client but no running controller (CI
    after apt-get install slurm-wlm) that question waits 9-10 s for a timeout, at every start. Tests
    that are not about SLURM get an ``scontrol`` that says "no controller" at once; the SLURM tests
    set SLURM_CONF for their own cluster, and then the real scontrol answers."""
    _ctrl_c_as_in_a_terminal()
    # The workflow's syntax cache (gpulab.code_inputs) of this run alone: shared by every Snakemake
    # the tests start, never the user's own cache.
    if "GPULAB_CACHE_DIR" not in os.environ:
        config._gpulab_cache = tempfile.mkdtemp(prefix="gpulab-test-cache-")
        os.environ["GPULAB_CACHE_DIR"] = config._gpulab_cache
    real = shutil.which("scontrol")
    if real is None:
        return
    shim = Path(tempfile.mkdtemp(prefix="gpulab-test-bin-"))
    (shim / "scontrol").write_text(
        "#!/bin/sh\n"
        '[ -z "$SLURM_CONF" ] && [ "$1" = show ] && [ "$2" = config ] && exit 1\n'
        f'exec {real} "$@"\n')
    (shim / "scontrol").chmod(0o755)
    os.environ["PATH"] = f"{shim}{os.pathsep}{os.environ.get('PATH', '')}"
    config._gpulab_shim = shim


def pytest_unconfigure(config):
    cache = getattr(config, "_gpulab_cache", None)
    if cache is not None:
        shutil.rmtree(cache, ignore_errors=True)
    shim = getattr(config, "_gpulab_shim", None)
    if shim is not None:
        shutil.rmtree(shim, ignore_errors=True)


# ---------------------------------------------------------------- running the suite on N workers
# `make test` runs the suite on pytest-xdist workers (--dist loadfile). Three rules keep that the
# same suite as a plain `pytest`:
# 1. A test file is one unit of work: its module fixtures (a whole pipeline run) run once, on one
#    worker. Files that use a machine-wide resource say so (`machine_wide("slurm")`: both SLURM
#    clusters write /etc/slurm), and hold it one at a time.
# 2. The long files are handed out first (longest first, by their time on one process): a 3-minute
#    pipeline that starts last ends last. The SLURM cluster file, mostly waiting on its cluster
#    (daemons, job start-ups, status polls every 2 s: tests/slurm/fastpoll.py), goes second: it runs
#    beside the busiest pipeline instead of beside another one.
# 3. A test marked `alone` measures this machine against itself (healthy vs degraded hosts): it
#    runs while no other test does, or another worker's pipeline would read as a sick host.
LONG_FIRST = ("test_workflow", "test_slurm_multinode", "test_odd_devices", "test_fleet",
              "test_interrupt", "test_train", "test_stages", "test_damaged_workflow", "test_report",
              "test_cli_and_inputs", "test_multinode", "test_fleet_faults", "test_collectives_ranks",
              "test_gemm", "test_slurm", "test_report_workflow", "test_slots", "test_lifetime",
              "test_wheelhouse")


def pytest_collection_modifyitems(config, items):
    """Files longest first (LONG_FIRST); inside a file, its `alone` tests after the others. An
    `alone` test waits for every other worker's current test to end, and a worker reaching the
    fleet file while another still builds the README's whole pipeline (one 2-minute test) sat
    idle for ~40 s: it now runs the file's other tests first, in their order."""
    def weight(item):
        name = item.path.stem
        return (LONG_FIRST.index(name) if name in LONG_FIRST else len(LONG_FIRST),
                item.get_closest_marker("alone") is not None)

    items.sort(key=weight)  # stable: the order inside a file is otherwise kept


def _lock_file(name: str) -> int:
    run = os.environ["PYTEST_XDIST_TESTRUNUID"]
    return os.open(Path(tempfile.gettempdir()) / f"gpulab-tests-{run}.{name}", os.O_RDWR | os.O_CREAT)


_RESOURCES_HELD: dict[str, int] = {}


@pytest.hookimpl(hookwrapper=True, tryfirst=True)  # outside pytest-timeout: waiting is not running
def pytest_runtest_protocol(item, nextitem):
    """Locks shared by this run's workers, always taken in one order (no deadlock):
    1. `machine_wide(name)`: held from a file's first test to its last (its module fixtures'
       teardown included), so two files never hold the resource at once.
    2. the gate, then the room: every test holds the room shared, an `alone` test exclusively. A
       test waiting to be alone holds the gate, so the other workers start nothing new meanwhile
       (a plain shared/exclusive lock would let them starve it)."""
    if "PYTEST_XDIST_TESTRUNUID" not in os.environ:
        yield
        return
    import fcntl

    wide = item.get_closest_marker("machine_wide")
    if wide and wide.args[0] not in _RESOURCES_HELD:
        fd = _RESOURCES_HELD[wide.args[0]] = _lock_file(wide.args[0])
        fcntl.flock(fd, fcntl.LOCK_EX)
    gate, room = _lock_file("gate"), _lock_file("room")
    try:
        fcntl.flock(gate, fcntl.LOCK_EX)
        fcntl.flock(room, fcntl.LOCK_EX if item.get_closest_marker("alone") else fcntl.LOCK_SH)
        os.close(gate)  # closing a file releases its lock
        gate = None
        yield
    finally:
        os.close(room)
        if gate is not None:
            os.close(gate)
        if wide and (nextitem is None or nextitem.path != item.path):
            os.close(_RESOURCES_HELD.pop(wide.args[0]))


def fixtures_on_path(folder: str) -> dict:
    """PYTHONPATH with tests/fixtures/<folder> first: its worker modules become importable in the
    processes a launch starts."""
    return {"PYTHONPATH": os.pathsep.join([str(FIXTURES / folder), os.environ.get("PYTHONPATH", "")])}


def copy_workflow(dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    for part in WORKFLOW_PARTS:
        src = REPO / part
        if src.is_dir():
            shutil.copytree(src, dest / part, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(src, dest / part)
    return dest


def copy_run(src: Path, dest: Path) -> Path:
    """A finished run's tree (workflow, results and Snakemake's records, file times kept) copied for
    a test that changes it: seconds, where running the pipeline again costs minutes."""
    shutil.copytree(src, dest, symlinks=True)
    return dest


# The host label and GPU pool of the CPU runs the tests share (no GPU ids handed out).
CPU_ENV = {"GPULAB_HOST": "testhost", "GPULAB_GPU_POOL": ""}


def shared_run(tmp_path_factory, name: str, build) -> Path:
    """``build(dest)`` run once for the whole suite, its tree shared by every worker.

    A session fixture runs once per xdist worker, and the files that use a finished run land on
    different workers: each would make its own. The first worker to ask builds it under a lock in
    the folder all workers' temporary folders share; the others wait for the lock and read it. A
    failed build is not kept: the next worker to ask builds it again (and fails on its own)."""
    if "PYTEST_XDIST_TESTRUNUID" not in os.environ:
        dest = tmp_path_factory.mktemp(name) / "wf"
        build(dest)
        return dest
    import fcntl

    root = tmp_path_factory.getbasetemp().parent / f"shared-{name}"
    root.mkdir(exist_ok=True)
    dest, done = root / "wf", root / "built"
    fd = _lock_file(f"shared-{name}")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(dest, ignore_errors=True)
            build(dest)
            done.touch()
    finally:
        os.close(fd)
    return dest


@pytest.fixture(scope="session")
def probe_report_run(tmp_path_factory) -> Path:
    """The probe and the report (config report.stages: [probe]), with another host's probe result
    copied into results/ as a user would, run once per suite (shared_run) for every test that needs
    a finished small run. Read-only: a test that changes the tree works on
    copy_run(probe_report_run, ...)."""
    return shared_run(tmp_path_factory, "probe-report", _build_probe_report_run)


def _build_probe_report_run(dest: Path) -> None:
    from gpulab import probe, results

    wf = copy_workflow(dest)
    cfg_path = wf / "config.yaml"
    cfg = yaml.safe_load(cfg_path.read_text())
    cfg.setdefault("report", {})["stages"] = ["probe"]
    cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GPULAB_HOST", "otherhost")
        results.write(probe.build_result("probe", "main", {"gpus": "all"}, probe.collect()),
                      wf / "results" / "probe" / "otherhost.h5")
    snakemake(wf, "--cores", "2", env=CPU_ENV)


@pytest.fixture
def workflow_dir(tmp_path) -> Path:
    """A private copy of the workflow (so tests never touch the checkout's results/)."""
    return copy_workflow(tmp_path / "wf")


# `python -m snakemake` polling a SLURM cluster every 2 s instead of backing off (tests/slurm/fastpoll.py)
FASTPOLL = Path(__file__).parent / "slurm" / "fastpoll.py"


def snakemake(cwd: Path, *args: str, env: dict | None = None, timeout: float = 900,
              check: bool = True, fast_slurm_polls: bool = False) -> subprocess.CompletedProcess:
    """``python -m snakemake *args`` in ``cwd``, its output captured. Forked from this worker's
    preloaded server where that is the same run (tests/forkedsnakemake.py says when), a fresh
    process otherwise."""
    e = dict(os.environ)
    e.update(env or {})
    e.setdefault("GPULAB_SLOT_DIR", str(cwd / ".slots"))
    if not fast_slurm_polls and forkedsnakemake.usable(e):
        p = forkedsnakemake.run(cwd, list(args), e, timeout)
    else:
        p = subprocess.run([sys.executable, *([str(FASTPOLL)] if fast_slurm_polls else ["-m", "snakemake"]), *args],
                           cwd=cwd, env=e, capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(p.args)} failed ({p.returncode}):\n{p.stdout[-4000:]}\n{p.stderr[-6000:]}")
    return p


def planned_rules(cwd: Path, *args: str, env: dict | None = None) -> dict[str, int]:
    """Rules (with job counts) a dry run would execute."""
    p = snakemake(cwd, "--cores", "2", "--dry-run", *args, env=env)
    return job_counts(p.stdout + p.stderr)


def job_counts(out: str) -> dict[str, int]:
    """The job-count table of a Snakemake run's output."""
    counts: dict[str, int] = {}
    in_table = False
    for line in out.splitlines():
        parts = line.split()
        if parts[:2] == ["job", "count"]:
            in_table = True
            continue
        if in_table:
            if len(parts) == 2 and parts[1].isdigit() and parts[0] != "total":
                counts[parts[0]] = int(parts[1])
            elif parts and parts[0] == "total":
                break
    return counts


def marked_processes(mark: str):
    """Every live process started under a test's GPULAB_TEST_MARK (workers included: they inherit
    it), for the tests that check no process outlives its job. Each carries its name and command
    line as they were when listed (``p.info["name"]``, ``" ".join(p.info["cmdline"])``): a process
    may end between the listing and a later ``p.name()``, which then raises."""
    import psutil

    out = []
    for p in psutil.process_iter(["pid", "name", "cmdline", "environ", "status"]):
        info = p.info
        if p.pid != os.getpid() and (info.get("environ") or {}).get("GPULAB_TEST_MARK") == mark \
                and info.get("status") != psutil.STATUS_ZOMBIE:
            info["cmdline"] = info.get("cmdline") or []
            out.append(p)
    return out


def kill_marked(mark: str) -> None:
    """SIGKILL every process of a test's mark (cleanup: one that ended meanwhile is fine)."""
    import psutil

    for p in marked_processes(mark):
        with contextlib.suppress(psutil.Error):
            p.kill()


def stage_settings(stage: str, **section):
    """A stage's typed view of a section given in part (the schema fills in the rest), as its job
    gets it."""
    from gpulab import config, stages

    return stages.get(stage).settings_class().from_section(config.validate_section(stage, section))


def stage_context(stage: str, variant: str, section: dict, devices: dict, out, extra=None):
    """A StageContext as a job gets one: its section and devices validated, defaults filled in, and
    the stage's config check passed."""
    from gpulab.stage import StageContext, validate_payload

    payload = validate_payload(stage, {"stage": dict(section), "devices": dict(devices)})
    return StageContext(stage, variant, payload["stage"], payload["devices"], out, extra or {})
