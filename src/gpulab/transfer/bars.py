"""The transfer stage's verdicts: bars against physical limits, checks, and what was not measured.

Bars (a measurement against a limit that comes from elsewhere, :class:`gpulab.outcomes.Bar`):

- same-device copy as a fraction of the datasheet memory (HBM) bandwidth. Byte counting: the copy
  reads N bytes and writes N bytes, so its GB/s counts read+write (2N per copy), which is the
  traffic the datasheet's memory bandwidth counts too; like is compared with like;
- pinned H2D and D2H of every GPU as a fraction of the PCIe limit of the generation and width its
  link can train to (per direction, after line encoding; :func:`gpulab.limits.pcie_bandwidth`);
  copies of at most ISSUE_BOUND_BYTES time the host's issue rate, not the link, and judge nothing;
- P2P bandwidth per ordered pair (P2P=Enabled, copy engine, one direction, bytes once) as a fraction
  of the NVLink limit if the pair is NVLink-connected (datasheet per-GPU NVLink bandwidth x the
  share of the GPU's links that reach the peer), else of the PCIe limit of the slower GPU's link.

Checks (:class:`gpulab.outcomes.Check`): every copy read back and compared; the spin kernel held
the stream in every sample (no timeout); P2P=Disabled stayed isolated; run-to-run spread; and the
*harness overhead* checks: gpulab's call path against torch doing the same copy on the same engine.
Those compare a library with itself on purpose (framework overhead) and are not performance results.
"""
from __future__ import annotations

import pandas as pd

from gpulab import devices as devmod
from gpulab import limits, plausible
from gpulab.outcomes import Bar, Check, NotApplicable, Verdict
from gpulab.transfer.measure import ISSUE_BOUND, ISSUE_BOUND_BYTES

# Fractions of the physical limit a healthy system reaches (an H200 SXM measured 0.83 of HBM for a
# copy and 0.88 of PCIe Gen5 x16 for pinned H2D; NVLink P2P copies reach 0.8-0.9 of the link).
HBM_COPY_THRESHOLD = 0.75
PCIE_THRESHOLD = 0.75
P2P_THRESHOLD = 0.70
HARNESS_THRESHOLD = 0.95  # gpulab's call path must reach 95% of torch doing the same copy
SPREAD_THRESHOLD = 0.05  # (max - min) / median of the samples

HARNESS = "harness overhead"
HARNESS_NOTE = ("framework overhead: the same copy on the same engine through gpulab's call path "
                "and through torch; not a performance result")
RW_NOTE = ("read+write counted (a copy of N bytes reads N and writes N: 2N of memory traffic, as "
           "the datasheet counts)")
NO_GPU = "needs a CUDA GPU; this host ran on CPU virtual devices"


def _same_device(p2p_rows: pd.DataFrame) -> pd.DataFrame:
    r = p2p_rows
    return r[(r.test == "uni") & (r.mechanism == "ce") & (r.src == r.dst)]


def hbm_bars(p2p_rows: pd.DataFrame, names: list[str]) -> list[Bar]:
    """Same-device copy (P2P=Enabled matrix, copy engine) per GPU vs its datasheet HBM bandwidth."""
    diag = _same_device(p2p_rows)
    out = []
    for d, name in enumerate(names):
        bar = f"same-device copy vs datasheet memory bandwidth, GPU{d}"
        lim = limits.memory_bandwidth(name)
        row = diag[(diag.p2p == "enabled") & (diag.src == d)]
        if not lim.known:
            out.append(Bar.not_applicable(bar, lim.reason, unit="GB/s"))
        elif row.empty:
            out.append(Bar.not_applicable(bar, "no same-device copy was measured", unit="GB/s"))
        elif bool(row.iloc[0].get("cache_resident", False)):
            out.append(Bar.not_applicable(
                bar, f"{int(row.iloc[0].bytes)} B per copy fits in L2: that measures the cache, not "
                     "memory; raise transfer.matrix_bytes", unit="GB/s"))
        else:
            m = row.iloc[0]
            out.append(Bar.measure(bar, m.value_median, lim.value, source=lim.source,
                                   threshold=HBM_COPY_THRESHOLD, unit="GB/s",
                                   note=f"{RW_NOTE}; {int(m.bytes)} B x {int(m.copies)} copies, "
                                        "cudaMemcpyPeerAsync"))
    return out


def pcie_limit(link: dict) -> limits.Limit:
    """The PCIe limit of a GPU's link: the generation and width it can train to in this slot."""
    return limits.pcie_bandwidth(link.get("pcie_gen_max"), link.get("pcie_width_max"))


def _link_note(link: dict) -> str:
    now = (link.get("pcie_gen_now"), link.get("pcie_width_now"))
    top = (link.get("pcie_gen_max"), link.get("pcie_width_max"))
    if None in now:
        return ""
    s = f"link ran at Gen{now[0]} x{now[1]} right after the copies"
    return s + (f" (can train to Gen{top[0]} x{top[1]}: a degraded link)" if now != top else "")


def pcie_bars(h2d: dict, host_device: pd.DataFrame, link: dict, device: int = 0) -> list[Bar]:
    """Pinned H2D and D2H (cudaMemcpyAsync, largest size, bytes once) vs the PCIe limit."""
    lim = pcie_limit(link)
    out = []
    hd = host_device
    d2h = hd[(hd.direction == "D2H") & (hd.memory == "pinned") & (hd.call == "async")] if len(hd) else hd
    d2h = d2h.sort_values("bytes").iloc[-1] if len(d2h) else None
    for what, row in (("H2D", h2d.get("mine")), ("D2H", d2h)):
        bar = f"pinned {what} vs PCIe limit, GPU{device}"
        if not lim.known:
            out.append(Bar.not_applicable(bar, lim.reason, unit="GB/s"))
        elif row is None:
            out.append(Bar.not_applicable(bar, f"no pinned {what} copy was measured", unit="GB/s"))
        elif int(row["bytes"]) <= ISSUE_BOUND_BYTES:
            out.append(Bar.not_applicable(bar, f"{ISSUE_BOUND} ({int(row['bytes'])} B per copy); "
                                               "raise transfer.host_sizes", unit="GB/s",
                                          measured=row["value_median"]))
        else:
            note = "; ".join(x for x in (f"bytes counted once; {int(row['bytes'])} B x "
                                         f"{int(row['copies'])} copies, cudaMemcpyAsync",
                                         _link_note(link)) if x)
            out.append(Bar.measure(bar, row["value_median"], lim.value, source=lim.source,
                                   threshold=PCIE_THRESHOLD, unit="GB/s", note=note))
    return out


def link_bars(h2d: dict, host_device: pd.DataFrame, per_gpu: pd.DataFrame | None,
              links: list[dict]) -> list[Bar]:
    """Pinned H2D and D2H bars of every GPU's link: GPU0 from the harness-check copy and the size
    sweep, every other GPU from its own pinned copies at the bar size (``per_gpu``, column
    ``device``), each against its own link (a degraded link on any GPU fails, issue 24)."""
    out = pcie_bars(h2d, host_device, links[0] if links else {}, 0)
    if per_gpu is None or not len(per_gpu):
        return out
    for d in sorted(int(x) for x in set(per_gpu["device"]) if int(x) != 0):
        rows = per_gpu[per_gpu["device"] == d]
        h2d_rows = rows[rows["direction"] == "H2D"].sort_values("bytes")
        mine = h2d_rows.iloc[-1].to_dict() if len(h2d_rows) else None
        out += pcie_bars({"mine": mine}, rows, links[d] if d < len(links) else {}, d)
    return out


def _min_limit(a: limits.Limit, b: limits.Limit) -> limits.Limit:
    """The slower of two links used one after the other; unknown where either is."""
    if not (a.known and b.known):
        return a if not a.known else b
    return a if a.value <= b.value else b


def p2p_limit(names: list[str], links: list[dict], i: int, j: int) -> tuple[limits.Limit, str]:
    """The limit of the pair i -> j and how the pair is connected."""
    share = devmod.nvlink_share(links, i, j) if links else None
    if share is None:
        return limits.Limit(None, "GB/s", "", "NVLink topology not known (NVML did not answer)"), "?"
    if share > 0:
        nv = limits.nvlink_bandwidth(names[i])
        if not nv.known:
            return nv, "NVLink"
        n = links[i]["nvlinks"]
        return (limits.Limit(nv.value * share, "GB/s",
                             f"{nv.source} x {share:.3g} ({round(share * n)} of {n} links reach GPU{j})"),
                "NVLink")
    return _min_limit(pcie_limit(links[i]), pcie_limit(links[j])), "PCIe"


def p2p_bars(p2p_rows: pd.DataFrame, names: list[str], links: list[dict]) -> list[Bar]:
    """One bar per ordered GPU pair with peer access: P2P=Enabled copy-engine bandwidth vs its link."""
    r = p2p_rows
    uni = r[(r.test == "uni") & (r.mechanism == "ce") & (r.p2p == "enabled") & (r.src != r.dst)]
    if uni.empty:
        return [Bar.not_applicable("P2P per GPU pair vs link limit",
                                   f"needs >= 2 GPUs ({len(names)} visible)", unit="GB/s")]
    out = []
    for m in uni.sort_values(["src", "dst"]).itertuples():
        i, j = int(m.src), int(m.dst)
        bar = f"P2P GPU{i}->GPU{j} vs link limit"
        if not bool(getattr(m, "peer_access", True)):
            share = devmod.nvlink_share(links, i, j) if links else None
            if share:  # NVML sees an NVLink path, CUDA refuses peer access: a broken setup
                out.append(Bar(bar, float(m.value_median), float("nan"), "NVML NVLink topology",
                               P2P_THRESHOLD, "GB/s", Verdict.FAIL.value, float("nan"), ">=",
                               "NVML reports NVLink between these GPUs but CUDA gives no peer access "
                               "(copies staged through the host): driver, fabric manager or "
                               "virtualisation setup"))
            else:
                out.append(Bar.not_applicable(bar, "no peer access between these GPUs (copies "
                                                   "staged through the host)", unit="GB/s"))
            continue
        lim, kind = p2p_limit(names, links, i, j)
        if not lim.known:
            out.append(Bar.not_applicable(bar, lim.reason, unit="GB/s"))
            continue
        out.append(Bar.measure(bar, m.value_median, lim.value, source=lim.source,
                               threshold=P2P_THRESHOLD, unit="GB/s",
                               note=f"{kind}; one direction, bytes counted once, P2P writes; "
                                    f"{int(m.bytes)} B x {int(m.copies)} copies"))
    return out


def gpu_bars(p2p_rows: pd.DataFrame, names: list[str], links: list[dict], h2d: dict,
             host_device: pd.DataFrame, per_gpu: pd.DataFrame | None = None) -> list[Bar]:
    """Every bar is against a physical limit, so each one is also guarded by
    :func:`gpulab.plausible.guard_all` (see :func:`plausibility_checks`)."""
    out = (hbm_bars(p2p_rows, names) + link_bars(h2d, host_device, per_gpu, links)
           + p2p_bars(p2p_rows, names, links))
    return plausible.guard_all(out)[0]


def _sum_limits(parts: list[limits.Limit], what: str) -> limits.Limit:
    """The limit of paths used at once: the sum of theirs, unknown where one of them is."""
    unknown = [p for p in parts if not p.known]
    if unknown or not parts:
        return unknown[0] if unknown else limits.Limit(None, "GB/s", "", f"{what}: no path")
    return limits.Limit(sum(p.value for p in parts), "GB/s",
                        f"{what}: " + " + ".join(f"{p.value:.4g} ({p.source})" for p in parts))


def hybrid_limit(names: list[str], links: list[dict], row: dict) -> limits.Limit:
    """The limit of a hybrid split row: its direct P2P path, its path staged through host memory
    (D2H from the source, H2D to the destination: the slower PCIe link), or both at once."""
    i, j = int(row["src"]), int(row["dst"])
    if max(i, j) >= len(links):
        return limits.Limit(None, "GB/s", "", "the GPUs' links are not known")
    p2p = p2p_limit(names, links, i, j)[0]
    host = _min_limit(pcie_limit(links[i]), pcie_limit(links[j]))
    parts = ([p2p] if int(row.get("p2p_bytes", 0)) > 0 else []) + \
        ([host] if int(row.get("host_bytes", 0)) > 0 else [])
    return _sum_limits(parts, "P2P link + staged through the host")


def threads_limit(links: list[dict], row: dict) -> limits.Limit:
    """Pinned H2D to ``gpus`` GPUs at once: the sum of their PCIe links."""
    n = int(row.get("gpus", 1))
    if n > len(links):
        return limits.Limit(None, "GB/s", "", "the GPUs' links are not known")
    return _sum_limits([pcie_limit(ln) for ln in links[:n]], f"PCIe of {n} GPU(s)")


def plausibility_checks(p2p_rows: pd.DataFrame, names: list[str], links: list[dict],
                        host_tables: list[pd.DataFrame], hybrid: pd.DataFrame | None = None,
                        threads: pd.DataFrame | None = None) -> list[Check]:
    """Every one-direction bandwidth row against its physical limit (issue 24): same-device copies
    (read+write) vs the datasheet memory bandwidth, GPU pairs vs their link, host <-> device rows
    vs their GPU's PCIe link, hybrid split rows vs the paths they use, the multi-GPU host-thread
    rows vs the sum of those GPUs' PCIe links. Bidirectional rows (a sum of two directions) and
    latencies are not compared; rows without a known limit give no check."""
    uni = p2p_rows[(p2p_rows.test == "uni") & (p2p_rows.unit == "GB/s")] if len(p2p_rows) else p2p_rows
    if "cache_resident" in uni.columns:  # L2-resident copies measure the cache, not memory
        uni = uni[~uni["cache_resident"].fillna(False).astype(bool)]

    def pair_limit(r):
        i, j = int(r["src"]), int(r["dst"])
        if i == j:
            return limits.memory_bandwidth(names[i] if i < len(names) else None)
        if r.get("p2p") == "disabled" or not bool(r.get("peer_access", True)):
            a = pcie_limit(links[i]) if i < len(links) else limits.Limit(None, "GB/s", "", "")
            b = pcie_limit(links[j]) if j < len(links) else a
            return a if (a.known and b.known and a.value <= b.value) or not b.known else b
        return p2p_limit(names, links, i, j)[0]

    out = plausible.row_checks(uni, "value_median", pair_limit, lambda r: (
        f"p2p {r['p2p']} {r['mechanism']} GPU{int(r['src'])}->GPU{int(r['dst'])} "
        f"{int(r['bytes'])} B"), "GB/s")
    for df in host_tables:
        if df is None or not len(df) or "device" not in df.columns:
            continue
        out += plausible.row_checks(df, "value_median", lambda r: pcie_limit(
            links[int(r["device"])] if int(r["device"]) < len(links) else {}), lambda r: (
            f"host<->device GPU{int(r['device'])} {r['direction']} {r['memory']} {r['call']} "
            f"{int(r['bytes'])} B"), "GB/s")
    if hybrid is not None and len(hybrid):
        out += plausible.row_checks(hybrid, "value_median", lambda r: hybrid_limit(
            names, links, r), lambda r: (f"hybrid {r['path']} GPU{int(r['src'])}->GPU{int(r['dst'])} "
                                         f"{int(r['bytes'])} B"), "GB/s")
    if threads is not None and len(threads):
        out += plausible.row_checks(threads, "value_median", lambda r: threads_limit(links, r),
                                    lambda r: (f"host threads {r['threading']} {r['call']} H2D to "
                                               f"{int(r['gpus'])} GPUs {int(r['bytes'])} B"), "GB/s")
    return out


GPU_BARS = ["same-device copy vs datasheet memory bandwidth", "pinned H2D vs PCIe limit",
            "pinned D2H vs PCIe limit", "P2P per GPU pair vs link limit"]


def cpu_bars() -> list[Bar]:
    return [Bar.not_applicable(b, NO_GPU, unit="GB/s") for b in GPU_BARS]


# -- checks -----------------------------------------------------------------------------------------

def harness_checks(p2p_rows: pd.DataFrame, torch_d2d: pd.DataFrame, h2d: dict) -> list[Check]:
    """gpulab's raw runtime calls vs torch issuing the same copies (framework overhead only)."""
    out = []
    diag = _same_device(p2p_rows)
    for t in torch_d2d.itertuples():
        for mode in ("enabled", "disabled"):
            m = diag[(diag.p2p == mode) & (diag.src == t.device)]
            if m.empty:
                continue
            ratio = m.iloc[0].value_median / t.value_median
            out.append(Check.of(HARNESS, f"same-device copy GPU{t.device} (P2P={mode.capitalize()} "
                                         "matrix): cudaMemcpyPeerAsync vs torch copy_",
                                ratio >= HARNESS_THRESHOLD, value=ratio, bound=HARNESS_THRESHOLD,
                                note=f"{HARNESS_NOTE}; ratio = gpulab / torch, read+write both"))
    mine, ref = h2d.get("mine"), h2d.get("torch")
    if mine is not None and ref is not None:
        ratio = mine["value_median"] / ref["value_median"]
        out.append(Check.of(HARNESS, "pinned H2D GPU0: cudaMemcpyAsync vs torch pinned copy_",
                            ratio >= HARNESS_THRESHOLD, value=ratio, bound=HARNESS_THRESHOLD,
                            note=f"{HARNESS_NOTE}; ratio = gpulab / torch"))
    return out


def spread_checks(p2p_rows: pd.DataFrame, h2d: dict) -> list[Check]:
    out = []
    diag = _same_device(p2p_rows)
    for m in diag[diag.p2p == "enabled"].itertuples():
        out.append(Check.within("run-to-run spread", f"same-device copy GPU{int(m.src)}", m.spread,
                                SPREAD_THRESHOLD, note=f"(max-min)/median of {int(m.repeats)} samples"))
    mine = h2d.get("mine")
    if mine is not None:
        out.append(Check.within("run-to-run spread", "pinned H2D GPU0", mine["spread"], SPREAD_THRESHOLD,
                                note=f"(max-min)/median of {int(mine['repeats'])} samples"))
    return out


_CASE_KEYS = ("test", "mechanism", "p2p", "src", "dst", "direction", "memory", "call", "threading",
              "path", "what", "device", "threads", "bytes")


def _case(table: str, row: pd.Series) -> str:
    keys = [f"{k}={row[k]}" for k in _CASE_KEYS if k in row.index and pd.notna(row[k])]
    return f"{table}: " + ", ".join(keys)


def _per_row(tables: dict[str, pd.DataFrame], column: str, make) -> list[Check]:
    """``make(case, row)`` for every row of every table that has ``column``."""
    return [make(_case(name, row), row) for name, df in tables.items()
            if df is not None and len(df) and column in df.columns for _, row in df.iterrows()]


def copy_checks(tables: dict[str, pd.DataFrame]) -> list[Check]:
    """One check per measured row: its destination read back equal to the source."""
    return _per_row(tables, "verified", lambda case, row: Check.of(
        "copy verified", case, bool(row["verified"]), note="destination read back and compared byte for byte"))


def spin_checks(tables: dict[str, pd.DataFrame]) -> list[Check]:
    """One check per spin-kernel sample set: no sample left invalid by a spin-kernel timeout."""
    def check(case, row):
        n = int(row["spin_timeouts"])
        return Check.of("spin kernel held the stream", case, n == 0, value=n, bound=0,
                        note="samples still timed out after retries (dropped)" if n else "no sample timed out")
    return _per_row(tables, "spin_timeouts", check)


def isolation_check(n_gpus: int, pairs_checked: int, ok: bool, text: str) -> Check:
    if n_gpus < 2 or not pairs_checked:
        return Check.of("P2P=Disabled isolation", "all pairs", None, note=text)
    return Check.of("P2P=Disabled isolation", "all pairs", ok, value=pairs_checked, note=text)


# -- not applicable ---------------------------------------------------------------------------------

def not_applicable(kind: str, n_gpus: int, peer_pairs: int) -> list[NotApplicable]:
    """What this host cannot measure, and why."""
    gpu = kind == "cuda"
    multi = gpu and n_gpus >= 2
    why_gpu = "" if gpu else "needs a CUDA GPU (CPU virtual devices here)"
    why_multi = "" if multi else (why_gpu or f"needs >= 2 GPUs ({n_gpus} visible)")
    why_peer = why_multi or ("" if peer_pairs else "no pair supports peer access")
    items = [
        ("P2P matrices, same-device cells (copy engine, SM copy)", why_gpu),
        ("P2P matrices, cross-device cells", why_multi),
        ("SM copy across devices (needs peer access)", why_peer),
        ("P2P size sweep 0->0", why_gpu),
        ("P2P size sweep 0->1", why_multi),
        ("host <-> device: pinned/pageable, async/blocking, size sweep", why_gpu),
        ("host <-> device: one thread for all GPUs vs one per GPU", why_gpu),
        ("hybrid split transfer (P2P + host path)", why_multi),
        ("cudaMalloc cost without peer access", why_gpu),
        ("cudaMalloc cost with peer access", why_peer),
        ("bars against datasheet memory, PCIe and NVLink limits", why_gpu),
        ("P2P bars per GPU pair", why_multi),
        ("harness overhead checks vs torch (same-device copy, pinned H2D)", why_gpu),
        ("CPU virtual-device matrices (memcpy between threads' buffers)",
         "" if not gpu else "GPU host: the GPU matrices are measured instead"),
    ]
    return [NotApplicable(what, why) for what, why in items if why]
