"""Run a measurement phase in a fresh (spawned) Python process.

Peer access is state of a CUDA context, and a process has one context per device. CuPy enables
peer access by itself when one of its kernels touches another GPU's array, and torch does so for
cross-device copies. Running the P2P=Disabled phase in a process of its own, which only ever makes
raw runtime calls on raw pointers, guarantees no earlier phase (or library) enabled it there.
"""
from __future__ import annotations

import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Callable

from gpulab import lifetime, phases


def _timed(fn: Callable[..., Any], args, kwargs) -> tuple[float, float, Any]:
    """In the child: (its start-up until here: spawn, imports; ``fn``'s own seconds; its value)."""
    startup = phases.process_age()
    t0 = time.perf_counter()
    value = fn(*args, **kwargs)
    return startup, time.perf_counter() - t0, value


def run_isolated(fn: Callable[..., Any], *args, **kwargs) -> Any:
    """``fn(*args, **kwargs)`` in a new spawned process; its exception is re-raised here. The job
    log and phases get the process's start-up (set-up) and its work (measurement) apart."""
    name = getattr(fn, "__name__", "isolated")
    # die_with_parent: a killed stage must not leave this process holding a CUDA context.
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                             initializer=lifetime.die_with_parent) as ex:
        startup, work, value = ex.submit(_timed, fn, args, kwargs).result()
    phases.record(f"{name}: process start-up (spawn, imports)", startup, phases.SETUP)
    phases.record(name, work, phases.MEASUREMENT)
    return value
