"""Where a job's wall time goes: set-up (process start, imports, devices, data, spawning workers)
versus measurement, one log line per phase and the list in the result (attr ``phases``).

A stage job is one process running one stage, so the recorder is per process: :func:`gpulab.stage
.stage_main` starts it, and code anywhere in the job marks a phase with ``with phase("name"):``
(a no-op recorder outside a stage job, e.g. in unit tests).
"""
from __future__ import annotations

import contextlib
import logging
import time

log = logging.getLogger("gpulab.phases")

SETUP, MEASUREMENT = "set-up", "measurement"


def process_age() -> float:
    """Seconds since this interpreter started (its imports included)."""
    import psutil

    return max(0.0, time.time() - psutil.Process().create_time())


class Recorder:
    def __init__(self, stage: str = ""):
        self.stage = stage
        self.rows: list[dict] = []

    def record(self, name: str, seconds: float, kind: str = MEASUREMENT) -> None:
        if kind not in (SETUP, MEASUREMENT):
            raise ValueError(f"phase kind must be {SETUP!r} or {MEASUREMENT!r}, got {kind!r}")
        self.rows.append({"phase": name, "kind": kind, "seconds": float(seconds)})
        log.info("%sphase %s (%s): %.2f s", f"{self.stage}: " if self.stage else "", name, kind,
                 seconds)

    @contextlib.contextmanager
    def phase(self, name: str, kind: str = MEASUREMENT):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.record(name, time.perf_counter() - t0, kind)

    @staticmethod
    def sums(rows: list[dict]) -> dict[str, float]:
        """Seconds per kind over ``rows`` (a recorder's rows, or a slice of them)."""
        out = {SETUP: 0.0, MEASUREMENT: 0.0}
        for r in rows:
            out[r["kind"]] += r["seconds"]
        return out


_current = Recorder()


def start(stage: str) -> Recorder:
    """A fresh recorder for this process's stage job."""
    global _current
    _current = Recorder(stage)
    return _current


def current() -> Recorder:
    return _current


def phase(name: str, kind: str = MEASUREMENT):
    """``with phase("P2P=Enabled"): ...``: time it as a phase of the current job."""
    return _current.phase(name, kind)


def record(name: str, seconds: float, kind: str = MEASUREMENT) -> None:
    _current.record(name, seconds, kind)
