"""Turn the ranks' raw rows into the stage's tables: per-case statistics, samples, bars.

A repetition's time is the slowest rank's (the collective is done when its last rank is); median,
min and max are over repetitions. algbw and busbw follow nccl-tests (see formulas).
"""
from __future__ import annotations

import math

import pandas as pd

from gpulab import devices as devmod
from gpulab import limits, plausible, timing
from gpulab.collectives import formulas
from gpulab.outcomes import Bar, Check

LIBRARY_LABEL = "library"
# nccl-tests and torch.distributed differ in their process model (see the report's methods), so
# the library may land on either side of nccl-tests; 5% either way is the same figure.
NCCL_TESTS_TOLERANCE = 0.05
RING_THRESHOLD = 0.70
# Without nccl-tests the library all-reduce is judged against the links between the GPUs (the
# NVLink share that reaches the other ranks, else the slowest PCIe link): NCCL's ring and tree
# all-reduces reach 0.75-0.9 of the link in busbw at large sizes; below one half is a broken path.
LINK_THRESHOLD = 0.5
ONE_RANK = "no communication with one rank"


def merge_ranks(rank_results: list[dict]) -> list[dict]:
    """One row per case: per-repetition max over ranks, wrong elements summed over ranks.

    The ranks given are this node's; the world size (which the busbw factor needs) is the one the
    ranks report, which spans every node of a multi-node job.
    """
    n = int(rank_results[0].get("world_size", len(rank_results)))
    per_rank = [r["rows"] for r in rank_results]
    if len({len(rows) for rows in per_rank}) != 1:
        raise RuntimeError("ranks returned different numbers of cases: "
                           f"{[len(rows) for rows in per_rank]}")
    merged = []
    for rows in zip(*per_rank):
        first = rows[0]
        keys = [(r["op"], r["mode"], r["bytes"]) for r in rows]
        if len(set(keys)) != 1:
            raise RuntimeError(f"ranks disagree on the case order: {keys}")
        samples = [max(vals) for vals in zip(*(r["samples"] for r in rows))]
        merged.append({**{k: v for k, v in first.items() if k != "samples"},
                       "world_size": n, "wrong": sum(int(r["wrong"]) for r in rows),
                       "samples": samples})
    return merged


def stats_row(row: dict) -> dict:
    """Time statistics and bandwidths of one case. With one rank nothing is communicated: algbw
    would be bytes / launch time (40 TB/s on an H200, issue 24), so it is left empty and the row
    says why (``note``)."""
    st = timing.summarize(row["samples"])
    n, op, size = row["world_size"], row["op"], row["bytes"]
    out = {k: v for k, v in row.items() if k != "samples"}
    out.update({"time_s_median": st.median, "time_s_min": st.min, "time_s_max": st.max,
                "repeats": st.n,
                "algbw_GBps": formulas.algbw(size, st.median) if n > 1 else math.nan,
                "note": "" if n > 1 else f"not applicable: {ONE_RANK}",
                "busbw_GBps": formulas.busbw(op, n, size, st.median),
                "busbw_GBps_min": formulas.busbw(op, n, size, st.max),
                "busbw_GBps_max": formulas.busbw(op, n, size, st.min),
                "bus_factor": formulas.bus_factor(op, n),
                "verified": row["wrong"] == 0})
    return out


def tables(merged: list[dict]) -> dict[str, pd.DataFrame]:
    """library: every library case; allreduce_algorithms: hand-written all-reduces next to the
    library's (in-place) all-reduce at the same sizes; samples: every repetition."""
    stats = pd.DataFrame([stats_row(r) for r in merged])
    out = {}
    lib = stats[stats["kind"] == "library"].drop(columns=["kind", "slices"], errors="ignore")
    out["library"] = lib.reset_index(drop=True)
    hand = stats[stats["kind"] == "handwritten"]
    if not hand.empty:
        ref = lib[(lib["op"] == "all_reduce") & (lib["mode"] == "in-place")].copy()
        ref["algorithm"] = LIBRARY_LABEL
        hand = hand.assign(algorithm=hand["op"])
        algs = pd.concat([ref, hand.drop(columns=["kind"])], ignore_index=True)
        cols = ["algorithm"] + [c for c in algs.columns if c not in ("algorithm", "op", "mode")]
        out["allreduce_algorithms"] = algs[cols]
    out["samples"] = pd.DataFrame([
        {"kind": r["kind"], "op": r["op"], "mode": r["mode"], "bytes": r["bytes"],
         "repetition": i, "time_s": t}
        for r in merged for i, t in enumerate(r["samples"])])
    return out


def library_allreduce(lib: pd.DataFrame) -> pd.DataFrame:
    """The library's in-place all-reduce rows labelled as the ``library`` algorithm: what the bars
    judge when no hand-written algorithm was configured (the health preset), issue 24."""
    if lib is None or lib.empty:
        return pd.DataFrame()
    ref = lib[(lib["op"] == "all_reduce") & (lib["mode"] == "in-place")].copy()
    ref["algorithm"] = LIBRARY_LABEL
    return ref.reset_index(drop=True)


def link_limit(device_name: str | None, links: list[dict]) -> limits.Limit:
    """The busbw limit of an all-reduce over these GPUs: per GPU, the datasheet NVLink bandwidth
    times the share of its links that reach another rank (direct or through an NVSwitch), the
    smallest over the GPUs; without NVLink between every pair, the slowest PCIe link."""
    n = len(links)
    if n < 2 or any("nvlinks" not in ln for ln in links):
        return limits.Limit(None, "GB/s", "", "NVLink topology not known (NVML did not answer)")
    shares = [devmod.nvlink_share(links, i, j) for i in range(n) for j in range(n) if i != j]
    if any(x is None for x in shares):
        return limits.Limit(None, "GB/s", "", "NVLink topology not known (NVML could not name "
                                              "the far end of a link)")
    if all(shares):
        nv = limits.nvlink_bandwidth(device_name)
        if not nv.known:
            return nv
        reach = [min(1.0, (ln["nvlinks_switch"] + sum(ln["nvlinks_to"].values())) / ln["nvlinks"])
                 for ln in links]
        return limits.Limit(nv.value * min(reach), "GB/s",
                            f"{nv.source} x {min(reach):.3g} (share of the links that reach "
                            "the other ranks)")
    pcie = [limits.pcie_bandwidth(ln.get("pcie_gen_max"), ln.get("pcie_width_max")) for ln in links]
    unknown = [p for p in pcie if not p.known]
    return unknown[0] if unknown else min(pcie, key=lambda p: p.value)


def plausibility_checks(lib: pd.DataFrame, device_name: str | None) -> list[Check]:
    """busbw of every case with more than one rank against the datasheet memory bandwidth: no
    collective moves bytes faster than a GPU reads them (issue 24). One-rank rows are not judged."""
    if lib is None or lib.empty:
        return []
    lim = limits.memory_bandwidth(device_name)
    rows = lib[lib["world_size"] > 1]
    return plausible.row_checks(rows, "busbw_GBps", lambda r: lim, lambda r: (
        f"{r['op']} {r['mode']} {int(r['bytes'])} B on {int(r['world_size'])} ranks (busbw)"),
        "GB/s")


def _busbw_at(df: pd.DataFrame, col: str, name: str, size: int) -> float:
    hit = df[(df[col] == name) & (df["bytes"] == size)]
    return float(hit["busbw_GBps"].iloc[0]) if len(hit) else math.nan


def checks(merged: list[dict], backend: str) -> list[Check]:
    """One check per case: every output element on every rank equal to the exact result."""
    return [Check.of("exact result on every rank", f"{backend} {r['kind']} {r['op']} {r['mode']} "
                     f"{r['bytes']} B", r["wrong"] == 0, value=r["wrong"], bound=0,
                     note="wrong elements summed over ranks (nccl-tests' #wrong)")
            for r in merged]


NCCL_BARS = ("library all-reduce busbw >= 95% of nccl-tests all_reduce_perf (in-place, median)",
             "library all-reduce busbw <= 105% of nccl-tests all_reduce_perf (in-place, median)")
RING_BAR = "hand-written ring all-reduce busbw >= 70% of the library all-reduce"
LINK_BAR = "library all-reduce busbw vs the GPUs' link limit (in-place, median)"


def bars(algs: pd.DataFrame | None, device_kind: str, n: int, nccl_ref: float | None,
         nccl_note: str, link: limits.Limit | None = None) -> list[Bar]:
    """At the largest size measured: the library against nccl-tests (two-sided, as two bars), or
    against the GPUs' link limit where nccl-tests is not installed, and the hand-written ring
    against the library (not applicable when no ring was configured)."""
    if algs is None or algs.empty:
        return []
    size = int(algs["bytes"].max())
    lib = _busbw_at(algs, "algorithm", LIBRARY_LABEL, size)
    ring = _busbw_at(algs, "algorithm", "ring", size)
    has_ring = bool((algs["algorithm"] == "ring").any())
    where = f"at {size} B ({size / 2**30:g} GiB)"
    if device_kind != "cuda":
        why = "defined for > 1 GPU (NCCL); CPU (gloo) values are in the tables for information"
    elif n < 2:
        why = f"world size 1: {ONE_RANK}"
    else:
        why = ""
    if why:
        return [Bar.not_applicable(b, f"{why}; {where}", unit="GB/s",
                                   measured=m if n > 1 else float("nan"))
                for b, m in ((NCCL_BARS[0], lib), (NCCL_BARS[1], lib), (RING_BAR, ring))]
    src = f"nccl-tests all_reduce_perf, {nccl_note}" if nccl_note else "nccl-tests all_reduce_perf"
    out = []
    if nccl_ref is None:
        out += [Bar.not_applicable(b, nccl_note or "nccl-tests all_reduce_perf not run",
                                   unit="GB/s", measured=lib) for b in NCCL_BARS]
        if link is not None and link.known:
            out.append(plausible.guard(Bar.measure(
                LINK_BAR, lib, link.value, source=link.source, threshold=LINK_THRESHOLD,
                unit="GB/s", note=f"{where}; no nccl-tests here, so judged against the link"))[0])
        elif link is not None:
            out.append(Bar.not_applicable(LINK_BAR, link.reason, unit="GB/s", measured=lib))
    else:
        note = (f"{where}; both sides the median over repetitions of the per-call time of a block "
                "of back-to-back calls; one process per GPU here, one process for all GPUs in "
                "nccl-tests")
        out += [Bar.measure(NCCL_BARS[0], lib, nccl_ref, source=src,
                            threshold=1 - NCCL_TESTS_TOLERANCE, unit="GB/s", note=note),
                Bar.measure(NCCL_BARS[1], lib, nccl_ref, source=src,
                            threshold=1 + NCCL_TESTS_TOLERANCE, unit="GB/s", direction="<=",
                            note=note)]
    if has_ring:
        out.append(Bar.measure(RING_BAR, ring, lib, source="library all-reduce (in place), same run",
                               threshold=RING_THRESHOLD, unit="GB/s", note=where))
    else:
        out.append(Bar.not_applicable(RING_BAR, "no hand-written ring configured "
                                                "(collectives.algorithms)", unit="GB/s"))
    return out
