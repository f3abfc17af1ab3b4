"""One benchmark case (a collective at one size) and how a rank measures and verifies it."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from gpulab import timing


@dataclass
class Case:
    """A collective call ready to run on this rank.

    run: the timed call (blocks the host on CPU; on GPU it is ordered on the current stream).
    restore: put the inputs back (untimed, before the check and before every repetition) so in-place
    reductions never accumulate and the check never sees stale output.
    check: number of wrong elements of this rank's output against the exact expected result.
    output: the tensor ``check`` reads (tests corrupt it to see the check fail).
    """

    kind: str  # "library" or "handwritten"
    op: str  # collective or hand-written algorithm name
    mode: str  # "in-place" / "out-of-place"
    bytes: int  # S as nccl-tests counts it
    count: int  # nccl-tests' per-rank count
    run: Callable[[], object]
    restore: Callable[[], object]
    check: Callable[[], int]
    output: object = None
    info: dict = field(default_factory=dict)


def measure_case(case: Case, *, device, barrier: Callable[[], object], sync: Callable[[], object],
                 warmup: int, repeats: int, iters: int) -> dict:
    """Verify once, then time ``repeats`` blocks of ``iters`` back-to-back calls (per-call seconds)."""
    case.restore()
    barrier()
    case.run()
    sync()
    wrong = case.check()

    def block():
        for _ in range(iters):
            case.run()

    def setup():
        case.restore()
        barrier()  # start every repetition together

    cuda = device is not None and device.type == "cuda"
    stats = timing.measure(block, warmup=warmup, repeats=repeats, device=device if cuda else None,
                           setup=setup)
    return {"kind": case.kind, "op": case.op, "mode": case.mode, "bytes": case.bytes,
            "count": case.count, "iters": iters, "wrong": wrong,
            "samples": [s / iters for s in stats.samples], **case.info}
