"""Energy of the same-device copy (J/GB, average W), measured by gpulab.energy."""
from __future__ import annotations

from gpulab import energy, outcomes
from gpulab.transfer.settings import Settings


def same_device_copy_rows(device_index: int | None, nbytes: int) -> list[dict]:
    """torch ``copy_`` of ``nbytes`` on one device (GPU ``device_index``, or the CPU when None),
    repeated for >= 1 s inside the meter; bytes counted read+write (2 x nbytes per copy), like
    the stage's same-device bandwidth."""
    import torch

    device = torch.device("cuda", device_index) if device_index is not None else torch.device("cpu")
    op = f"same-device copy {nbytes} B (read+write)"
    meter, why = energy.torch_meter(device)
    if meter is None:
        return [energy.not_applicable_row(op, str(device), why, "GB")]
    src = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    r = energy.measure(lambda: dst.copy_(src), meter, energy.torch_sync(device))
    ok = bool(torch.equal(dst, src))
    row = energy.row(op, str(device), meter.name, 2 * nbytes / 1e9, "GB", r)
    if not ok:
        row.update(resolved=False, energy_J=float("nan"), note="copy output differs from its input")
    return [row]


def gpu_phase(cfg: Settings) -> list[dict]:
    """Every visible GPU's copy (run in an isolated process like the stage's other GPU phases)."""
    import torch

    return [r for i in range(torch.cuda.device_count())
            for r in same_device_copy_rows(i, cfg.matrix_bytes)]


def add_table(result, cfg: Settings, kind: str) -> None:
    """The stage's ``energy`` table (GPU: every GPU in an isolated process; CPU: RAPL)."""
    import pandas as pd

    try:
        if kind == "cuda":
            from gpulab.transfer.isolate import run_isolated

            rows = run_isolated(gpu_phase, cfg)
        else:
            rows = same_device_copy_rows(None, cfg.matrix_bytes)
    except Exception as exc:  # noqa: BLE001 - the energy rows never take the stage down
        rows = [energy.not_applicable_row("same-device copy", kind, f"energy measurement failed: "
                                          f"{exc!r}", "GB")]
    df = pd.DataFrame(rows, columns=energy.COLUMNS)
    result.add_table("energy", df, outcomes.units_for(df))
