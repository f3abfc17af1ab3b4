"""One rank: every multi-device GEMM measurement of one launch (one transport).

Started by :func:`gpulab.gemm.runner.run_multi` through :func:`gpulab.launch.run_workers` on the
largest rank count needed; smaller counts P run on the first P ranks (their own process groups)
while the others wait, so one launch (one NCCL set-up) covers the whole strong-scaling sweep.
Global rank 0 returns the rows; every row carries its own verification.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from gpulab import launch, timing
from gpulab.gemm import algorithms as alg
from gpulab.gemm import layout, numerics

ALGORITHMS = ("row1d", "summa", "summa_overlap")


def _team_reduce(values: list[float], team: alg.Team, device, op) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=device)
    if team.p > 1:
        dist.all_reduce(t, op=op, group=team.group)
    return t.tolist()


class Case:
    """One (size, precision, team) with its distributed inputs, outputs and float64 references."""

    def __init__(self, team: alg.Team, a32, b32, prec: numerics.Precision, panels: int, device):
        self.team, self.prec, self.device = team, prec, device
        m, k = a32.shape
        n = b32.shape[1]
        self.m, self.n, self.k = m, n, k
        a = a32.to(prec.dtype)
        b = b32.to(prec.dtype)
        self.rowplan = layout.RowPlan(m, n, k, team.p)
        self.plan = layout.SummaPlan(m, n, k, team.rows, team.cols, panels)
        self._setup_row1d(a, b)
        self._setup_summa(a, b)

    def _zeros(self, *shape):
        return torch.zeros(*shape, dtype=self.prec.dtype, device=self.device)

    def _setup_row1d(self, a, b) -> None:
        rp, first = self.rowplan, self.team.rank == 0
        self.r_aloc = self._zeros(rp.mb, self.k)
        self.r_cloc = self._zeros(rp.mb, self.n)
        if first:
            self.r_afull = self._zeros(rp.m_pad, self.k)
            self.r_afull[: self.m] = a
            self.r_b = b.clone()
            self.r_cfull = self._zeros(rp.m_pad, self.n)
            self.r_ref = self.r_afull.double() @ self.r_b.double()
        else:
            self.r_afull = self.r_cfull = self.r_ref = None
            self.r_b = self._zeros(self.k, self.n)

    def _setup_summa(self, a, b) -> None:
        pl = self.plan
        i, j = self.team.coords
        a_pad = self._zeros(pl.mb * pl.rows, pl.k_pad)
        a_pad[: self.m, : self.k] = a
        b_pad = self._zeros(pl.k_pad, pl.nb * pl.cols)
        b_pad[: self.k, : self.n] = b
        rows = slice(i * pl.mb, (i + 1) * pl.mb)
        cols = slice(j * pl.nb, (j + 1) * pl.nb)
        self.s_a = a_pad[rows, j * pl.kb_a:(j + 1) * pl.kb_a].contiguous()
        self.s_b = b_pad[i * pl.kb_b:(i + 1) * pl.kb_b, cols].contiguous()
        self.s_c = self._zeros(pl.mb, pl.nb)
        self.s_apan = [self._zeros(pl.mb, pl.w) for _ in range(2)]
        self.s_bpan = [self._zeros(pl.w, pl.nb) for _ in range(2)]
        self.s_ref = a_pad[rows].double() @ b_pad[:, cols].double()

    def runner(self, name: str):
        t = self.team
        if name == "row1d":
            return lambda seg: alg.row1d(t, self.r_afull, self.r_b, self.r_aloc, self.r_cloc,
                                         self.r_cfull, seg)
        if name in ("summa", "summa_overlap"):
            return lambda seg: alg.summa(t, self.plan, self.s_a, self.s_b, self.s_c, self.s_apan,
                                         self.s_bpan, seg, overlap=name == "summa_overlap")
        raise ValueError(f"unknown algorithm {name!r} (known: {', '.join(ALGORITHMS)})")

    def error_terms(self, name: str) -> tuple[float, float]:
        """This rank's share of ||C - C_ref||^2 and ||C_ref||^2 (row1d: all of C is on rank 0)."""
        if name == "row1d":
            return numerics.error_terms(self.r_cfull, self.r_ref) if self.team.rank == 0 else (0.0, 0.0)
        return numerics.error_terms(self.s_c, self.s_ref)


def measure(case: Case, name: str, warmup: int, repeats: int, device) -> dict:
    """Time ``repeats`` runs (after ``warmup``), then check the last run's C against float64."""
    team, fn = case.team, case.runner(name)
    for _ in range(warmup):
        fn(alg.Segments(device))
    totals, computes = [], []
    for _ in range(repeats):
        dist.barrier(group=team.group)  # start together; the slowest rank defines the run
        seg = alg.Segments(device)
        seg.begin()
        fn(seg)
        seg.end()
        total, compute = seg.times()
        totals.append(total)
        computes.append(compute)
    # Per repetition, the slowest rank's time (total and compute taken independently).
    both = _team_reduce(totals + computes, team, device, dist.ReduceOp.MAX)
    tot = timing.summarize(both[:repeats])
    comp = timing.summarize(both[repeats:])
    err_sq, ref_sq = _team_reduce(list(case.error_terms(name)), team, device, dist.ReduceOp.SUM)
    rel = numerics.relative_error(err_sq, ref_sq)
    pl = case.plan
    return {
        "algorithm": name, "P": team.p,
        "grid": f"{team.p}x1" if name == "row1d" else f"{team.rows}x{team.cols}",
        "panels": pl.panels if name != "row1d" else 1,
        "M": case.m, "N": case.n, "K": case.k, "dtype": case.prec.name,
        **tot.as_dict("time_s"),
        "tflops_median": numerics.tflops(case.m, case.n, case.k, tot.median),
        "tflops_max": numerics.tflops(case.m, case.n, case.k, tot.min),
        "tflops_min": numerics.tflops(case.m, case.n, case.k, tot.max),
        "compute_s": comp.median,
        "comm_s": max(tot.median - comp.median, 0.0),
        "rel_error": rel, "bound": case.prec.bound,
    }


def work(ctx: launch.WorkerContext, payload: dict) -> dict:
    device = ctx.device
    if device.type == "cpu":
        torch.set_num_threads(int(payload.get("threads", 1)))
    ps = sorted({int(p) for p in payload["ranks"] if int(p) <= ctx.world_size})
    teams = {p: alg.make_team(p, ctx.world_size, ctx.rank, *layout.grid_shape(p)) for p in ps}
    rows = []
    for si, (m, n, k) in enumerate(payload["sizes"]):
        a32, b32 = numerics.random_inputs(m, n, k, int(payload["seed"]) + si, device)
        for pname in payload["dtypes"]:
            prec = numerics.precision(pname)
            with numerics.matmul_mode(prec):
                for p in ps:
                    team = teams[p]
                    if not team.member:
                        continue  # ranks >= p wait for the next team's first barrier
                    case = Case(team, a32, b32, prec, int(payload["summa_panels"]), device)
                    for name in payload["algorithms"]:
                        row = measure(case, name, int(payload["warmup"]), int(payload["repeats"]),
                                      device)
                        rows.append({**row, "transport": payload["transport"]})
                    del case
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
    return {"rank": ctx.rank, "rows": rows if ctx.rank == 0 else []}


if __name__ == "__main__":
    launch.worker_main(work)
