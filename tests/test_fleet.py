"""Issue 19: baselines, the fleet view and the health preset, on real CPU measurements.

The real-measurement tests run the stages' measurement code under several host labels, one host
really degraded (pinned to one core that busy loops share). This machine may be shared with other
jobs, so the fleet settings here are those for a noisy CPU VM (MAD floor 0.2 on ln x, i.e. ~20 %) and the
baseline tolerance is 60 %; the degradation is several-fold, far outside both.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parent))
from healthmeasure import machine_state, measure_host  # noqa: E402

from gpulab import baseline as bl  # noqa: E402
from gpulab import cli  # noqa: E402
from gpulab import fleet as fl  # noqa: E402
from gpulab import metrics as metmod  # noqa: E402

CPU_FLEET = fl.Settings(threshold=3.5, mad_floor=0.2, min_hosts=3)
CPU_TOLERANCE = 0.6
# A healthy host's run keeps a core busy: its CPU share is close to what a busy loop gets just
# before it. Much less means other tenants took the CPU while it ran; a plain memcpy far from the
# first healthy host's means they took the memory bandwidth. Either way that run was not healthy.
MIN_CPU_SHARE = 0.6
MEMCPY_BAND = 0.35
# Nor is a run during which other processes kept 0.3 of a core busy: the measurement's threads
# want both cores. (A CI run read node2's GEMM at 0.32x the fleet's with its own CPU share full:
# something else had the other core. Here a busy loop beside a host reads 0.95, an idle machine
# 0.005-0.15: kernel threads, the pytest processes.)
MAX_OTHERS_CORES = 0.3


class SlowSpell(Exception):
    """The machine's memory bandwidth rose well above the fleet's reference: the reference (and the
    hosts measured with it) came from a slow spell, so the fleet is measured again."""


def measure_healthy(root: Path, host: str, reference: dict) -> str:
    """Measure ``host``; "" when it ran healthy, else why not (after 3 tries)."""
    why = ""
    for _ in range(3):
        capacity, memcpy = machine_state()
        share, others = measure_host(root, host)
        ref = reference.setdefault("memcpy", memcpy)
        drift = f"memcpy ran at {memcpy:.1f} GB/s, {ref:.1f} GB/s before the first host"
        if share < MIN_CPU_SHARE * capacity:
            why = f"{host} got {share:.0%} of a CPU where a busy loop got {capacity:.0%}"
        elif others > MAX_OTHERS_CORES:
            why = f"other processes kept {others:.2f} core(s) busy while {host} was measured"
        elif memcpy / ref - 1 > MEMCPY_BAND:
            raise SlowSpell(drift)
        elif 1 - memcpy / ref > MEMCPY_BAND:
            why = drift
        else:
            return ""
    return why


def measure_fleet(root: Path) -> str:
    """Five hosts, 'sick' degraded; "" when every healthy one ran healthy, else why not."""
    reference: dict = {}
    for host in ("node1", "node2", "sick", "node3", "node4"):
        if host == "sick":
            measure_sick(root, host)
        elif why := measure_healthy(root, host, reference):
            return why  # busy through 3 tries of one host: the machine is taken
    return ""


def measure_sick(root: Path, host: str) -> None:
    capacity, _ = machine_state()
    share, _ = measure_host(root, host, slow=True)
    assert share < MIN_CPU_SHARE * capacity, f"the degradation did not take: {share:.0%} of {capacity:.0%}"


def _samples(spec: dict[str, list[float]], group="cuda: NVIDIA H200", metric="m", unit="GB/s",
             better="higher") -> pd.DataFrame:
    rows = [{"group": group, "host": h, "stage": "transfer", "metric": metric, "unit": unit,
             "better": better, "sample": i, "value": v} for h, vs in spec.items() for i, v in enumerate(vs)]
    return pd.DataFrame(rows, columns=metmod.COLUMNS)


def _around(x, n=5, rel=0.002, seed=0):
    rng = np.random.default_rng(seed)
    return list(x * (1 + rel * rng.standard_normal(n)))


# ---------------------------------------------------------------- fleet statistics (synthetic)

def test_fleet_flags_the_slow_host_in_the_bad_direction_only():
    spec = {f"n{i}": _around(100 + i, seed=i) for i in range(6)}
    spec["slow"] = _around(70, seed=9)
    spec["fast"] = _around(130, seed=10)  # faster than the fleet is not sick
    dev = fl.deviations(_samples(spec))
    assert fl.flagged_hosts(dev) == {"cuda: NVIDIA H200": ["slow"]}
    row = fl.suspects(dev).iloc[0]
    assert row["host"] == "slow" and row["ratio"] == pytest.approx(70 / 103, rel=0.02)


def test_fleet_latency_is_bad_when_higher():
    spec = {f"n{i}": _around(2.0, seed=i) for i in range(5)}
    spec["laggy"] = _around(3.0, seed=7)
    dev = fl.deviations(_samples(spec, unit="us", better="lower"))
    assert list(fl.suspects(dev)["host"]) == ["laggy"]


def test_mad_floor_keeps_a_noise_free_fleet_from_flagging_tiny_deviations():
    spec = {f"n{i}": [100.0] * 5 for i in range(5)}
    spec["a_bit_off"] = [99.5] * 5  # 0.5 %: MAD is 0, so without a floor z would be infinite
    dev = fl.deviations(_samples(spec))
    assert not dev["flagged"].any()
    spec["really_off"] = [80.0] * 5
    assert fl.flagged_hosts(fl.deviations(_samples(spec))) == {"cuda: NVIDIA H200": ["really_off"]}


def test_one_slow_sample_of_a_healthy_host_is_not_a_sick_host():
    spec = {f"n{i}": _around(100, seed=i) for i in range(5)}
    spec["spiky"] = [60.0, 61.0, 62.0, 100.5, 101.0]  # median low, best sample above the fleet's
    assert not fl.deviations(_samples(spec))["flagged"].any()


def test_gpu_models_are_never_mixed_and_small_groups_flag_nobody():
    h200 = _samples({f"h{i}": _around(100, seed=i) for i in range(4)})
    h100 = _samples({"x1": [50.0] * 5, "x2": [51.0] * 5}, group="cuda: NVIDIA H100")
    dev = fl.deviations(pd.concat([h200, h100], ignore_index=True))
    assert set(dev[dev["group"] == "cuda: NVIDIA H200"]["host"]) == {"h0", "h1", "h2", "h3"}
    assert not dev["flagged"].any()  # H100s are slower than H200s, but they are not compared
    text = fl.format_text(dev)
    assert "fewer than 3 hosts" in text and "cuda: NVIDIA H100" in text


def test_ecc_errors_on_a_fleet_of_zeros_are_flagged():
    spec = {f"n{i}": [0.0] for i in range(5)}
    spec["bad_mem"] = [2.0]
    dev = fl.deviations(_samples(spec, unit="errors", better="lower"))
    assert fl.flagged_hosts(dev) == {"cuda: NVIDIA H200": ["bad_mem"]}


# ---------------------------------------------------------------- baseline verdicts (synthetic)

def test_compare_one_verdicts_and_tolerance():
    base = [100, 101, 99, 100.5, 99.5]
    same = bl.compare_one("m", "GB/s", "higher", base, [100.2, 99.8, 100.9, 99.1, 100.4])
    assert same.change == "same" and not same.separated
    slow = bl.compare_one("m", "GB/s", "higher", base, [80, 81, 79, 80.5, 79.5])
    assert slow.change == "regression" and slow.separated and slow.ratio == pytest.approx(0.8)
    assert slow.mannwhitney_p < 0.01
    # separated but within tolerance: a run-to-run shift, not a change
    shifted = bl.compare_one("m", "GB/s", "higher", base, [95, 95.2, 94.8, 95.1, 94.9])
    assert shifted.separated and shifted.change == "same"
    faster_latency = bl.compare_one("m", "us", "lower", base, [50, 51, 49, 50, 50.5])
    assert faster_latency.change == "improvement" and faster_latency.gain == pytest.approx(2.0)
    # states read once have no noise: one NVLink of 18 down is a regression, one ECC error too
    assert bl.compare_one("links", "links", "higher", [18], [17]).change == "regression"
    assert bl.compare_one("ecc", "errors", "lower", [0], [1]).change == "regression"
    assert bl.compare_one("ecc", "errors", "lower", [0], [0]).change == "same"


def test_a_reference_from_a_slow_spell_remeasures_the_fleet_and_a_busy_host_says_why(monkeypatch, tmp_path):
    """The guards of the real-measurement fixture below, on scripted readings: memcpy well above the
    reference means the reference was slow (measure the fleet again), well below means other
    tenants took the bandwidth (try the host again, then say why)."""
    me = sys.modules[__name__]

    readings = iter([(1.0, 10.0), (1.0, 10.5), (1.0, 16.0), (1.0, 5.0), (1.0, 5.0), (1.0, 5.0)])
    monkeypatch.setattr(me, "machine_state", lambda: next(readings))
    monkeypatch.setattr(me, "measure_host", lambda root, host: (0.95, 0.02))
    ref: dict = {}
    assert measure_healthy(tmp_path, "node1", ref) == "" and ref == {"memcpy": 10.0}
    assert measure_healthy(tmp_path, "node2", ref) == ""  # 5 % off: the same machine
    with pytest.raises(SlowSpell, match="16.0 GB/s, 10.0 GB/s"):
        measure_healthy(tmp_path, "node3", ref)
    assert "5.0 GB/s, 10.0 GB/s" in measure_healthy(tmp_path, "node3", ref)  # 3 tries, all low
    monkeypatch.setattr(me, "measure_host", lambda root, host: (0.2, 0.02) if host == "busy" else (0.95, 0.02))
    readings = iter([(1.0, 10.0)] * 3)
    assert "busy got 20% of a CPU" in measure_healthy(tmp_path, "busy", ref)
    # its own CPU share full, while something else kept the other core busy: tried again, then why
    tries = iter([(0.97, 0.9), (0.97, 0.6), (0.97, 0.03)])
    monkeypatch.setattr(me, "measure_host", lambda root, host: next(tries))
    readings = iter([(1.0, 10.0)] * 3)
    assert measure_healthy(tmp_path, "crowded", ref) == ""  # the third try ran alone
    tries = iter([(0.97, 0.9)] * 3)
    readings = iter([(1.0, 10.0)] * 3)
    assert "other processes kept 0.90 core(s) busy while crowded" in measure_healthy(tmp_path, "crowded", ref)


# ---------------------------------------------------------------- real measurements

@pytest.fixture(scope="module")
def fleet_results(tmp_path_factory) -> Path:
    """Five hosts measured for real on this machine; 'sick' degraded while it ran."""
    why = ""
    for _ in range(3):  # a fleet whose reference came from a slow spell is measured again, whole
        root = tmp_path_factory.mktemp("fleet") / "results"
        try:
            why = measure_fleet(root)
        except SlowSpell as exc:
            why = f"{exc} (the reference came from a slow spell)"
            continue
        if not why:
            return root
        break
    pytest.skip(f"this machine is too busy to measure a healthy host (other processes' load): {why}, "
                "in each of 3 tries")


@pytest.mark.slow
@pytest.mark.alone
@pytest.mark.timeout(300)
def test_fleet_flags_the_degraded_host_and_only_it(fleet_results, capsys):
    samples = metmod.find(fleet_results)
    assert set(samples["host"]) == {"node1", "node2", "node3", "node4", "sick"}
    assert samples.groupby(["host", "metric"]).size().min() == 5  # every repetition kept
    dev = fl.deviations(samples, CPU_FLEET)
    assert fl.flagged_hosts(dev) == {"cpu: CPU virtual devices": ["sick"]}, fl.format_text(dev, CPU_FLEET)
    rc = cli.main(["fleet", "--results-dir", str(fleet_results), "--mad-floor", "0.2",
                   "--fail-on-suspect"])
    out = capsys.readouterr().out
    assert rc == 1 and "sick" in out and "node1 " not in out.split("suspect hosts")[1]


@pytest.mark.slow
@pytest.mark.alone
@pytest.mark.timeout(300)
def test_baseline_flags_a_real_slowdown_and_passes_an_unchanged_rerun(fleet_results, tmp_path, capsys):
    """A baseline of node1's real run against node2's (another healthy run of this machine, measured
    in the same session) and the degraded run of 'sick', both chosen with --host: the fleet's own
    measurements, so no host is measured twice."""
    bdir = tmp_path / "baselines"
    assert cli.main(["baseline", "save", "ref", "--results-dir", str(fleet_results), "--host", "node1",
                     "--baselines-dir", str(bdir)]) == 0
    doc = yaml.safe_load((bdir / "ref.yaml").read_text())
    assert doc["gpulab_baseline"] == 1 and doc["host"] == "node1"
    assert doc["group"] == "cpu: CPU virtual devices" and len(doc["metrics"]) >= 10
    assert all(e["n"] == 5 and len(e["samples"]) == 5 for e in doc["metrics"].values())

    capsys.readouterr()
    assert cli.main(["compare", "ref", "--results-dir", str(fleet_results), "--host", "node2",
                     "--baselines-dir", str(bdir), "--tolerance", str(CPU_TOLERANCE)]) == 0, \
        capsys.readouterr().out
    summary = capsys.readouterr().out.strip().splitlines()[-1]
    assert "against baseline 'ref'" in summary and "regression" not in summary

    jpath = tmp_path / "cmp.json"
    rc = cli.main(["compare", "ref", "--results-dir", str(fleet_results), "--host", "sick",
                   "--baselines-dir", str(bdir), "--tolerance", str(CPU_TOLERANCE),
                   "--json", str(jpath)])
    assert rc == 1
    df = bl.from_json(jpath.read_text())
    reg = df[df["change"] == "regression"]
    assert len(reg) >= 1 and (reg["gain"] < 1 - CPU_TOLERANCE).all()

    # the report renders both the fleet view and the comparison
    from gpulab.report import build_report
    from gpulab import results

    built = build_report(results.find_results(fleet_results) + [jpath], "t")
    assert not built.errors, built.errors
    assert "Against baseline ref" in built.html and "suspect hosts" in built.html


# ---------------------------------------------------------------- bad baseline files

def _baseline_doc(**over) -> dict:
    doc = {"gpulab_baseline": 1, "name": "b", "group": "cuda: NVIDIA H200", "host": "h",
           "metrics": {"m": {"unit": "GB/s", "better": "higher", "median": 1.0, "min": 1.0,
                             "max": 1.0, "n": 1, "samples": [1.0]}}}
    doc.update(over)
    return doc


@pytest.mark.parametrize("content, message", [
    (None, "no baseline"),
    ("gpulab_baseline: 7\ngroup: x\nmetrics: {}\n", "format version 7"),
    ("just: a yaml file\n", "not a gpulab baseline"),
    (":\n  - [unbalanced", "not valid YAML"),
    (json.dumps(_baseline_doc(metrics={"m": {"better": "sideways", "samples": [1]}})), "better"),
])
def test_bad_baseline_files_get_a_clear_error(tmp_path, capsys, content, message):
    if content is not None:
        (tmp_path / "b.yaml").write_text(content)
    with pytest.raises(bl.BaselineError, match=message):
        bl.load("b", tmp_path)
    assert cli.main(["compare", "b", "--baselines-dir", str(tmp_path),
                     "--results-dir", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err


def test_baseline_of_another_gpu_model_is_refused(tmp_path):
    (tmp_path / "b.yaml").write_text(bl.dumps(_baseline_doc()))
    doc = bl.load("b", tmp_path)
    current = _samples({"cpuhost": [1.0, 1.1]}, group="cpu: CPU virtual devices")
    with pytest.raises(bl.BaselineError, match="different GPU models are never compared"):
        bl.compare(doc, current)


def test_baseline_save_refuses_to_overwrite_and_names_bad_names(tmp_path):
    (tmp_path / "b.yaml").write_text("x")
    with pytest.raises(bl.BaselineError, match="exists"):
        bl.save(tmp_path / "results", "b", tmp_path)
    with pytest.raises(bl.BaselineError, match="name"):
        bl.path_for("../escape")


def test_cli_help_lists_the_commands(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert all(w in out for w in ("baseline", "compare", "fleet"))


# ---------------------------------------------------------------- workflow

@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_health_preset_end_to_end(workflow_dir):
    """The preset runs only the health stages, keeps samples, and its report has the fleet chapter;
    a baseline saved from it and compared through Snakemake says nothing regressed."""
    import time

    from conftest import snakemake

    from gpulab import results

    capacity, _ = machine_state()
    t0 = time.monotonic()
    snakemake(workflow_dir, "--cores", "2", "--configfile", "workflow/presets/health.yaml",
              env={"GPULAB_HOST": "e2e"})
    elapsed = time.monotonic() - t0
    res = workflow_dir / "results"
    stages = {p.relative_to(res).parts[0] for p in res.rglob("*.h5")}
    assert stages == {"probe", "transfer", "collectives", "gemm"}, stages
    html = (workflow_dir / "results" / "report" / "report.html").read_text()
    assert "Fleet and baselines" in html
    samples = metmod.find(workflow_dir / "results")
    assert {"transfer", "collectives", "gemm"} <= set(samples["stage"])
    assert samples.groupby("metric").size().min() >= 5
    # Issue 25's "under a minute on 2 cores" is a benchmark figure (README, notes), not a bar here:
    # a timed unit test fails on a busy CI host and proves nothing about the code.
    print(f"health preset: {elapsed:.0f} s (a busy loop got {capacity:.0%} of a core before it)")
    # the per-GPU GEMM health figure, and no one-rank all-reduce figure (nothing crosses a link)
    assert samples["metric"].str.startswith("gemm/per_gpu/gpu=0/").any()
    assert not samples["metric"].str.contains("algbw").any()
    probe = results.read_table(workflow_dir / "results" / "probe" / "e2e.h5", "checks")
    assert probe.empty or set(probe["verdict"]) <= {"pass", "not_applicable"}

    cfg = ["--config", 'fleet={"baseline": "e2e-ref"}']
    snakemake(workflow_dir, "baseline_save", "--cores", "2", "--configfile",
              "workflow/presets/health.yaml", *cfg, env={"GPULAB_HOST": "e2e"})
    assert (workflow_dir / "baselines" / "e2e-ref.yaml").exists()
    # the same results against their own baseline: 'same' everywhere, so the target succeeds
    p = snakemake(workflow_dir, "compare", "--cores", "2", "--configfile",
                  "workflow/presets/health.yaml", *cfg, env={"GPULAB_HOST": "e2e"})
    summary = [ln for ln in (p.stdout + p.stderr).splitlines() if "against baseline 'e2e-ref'" in ln]
    assert summary and "same" in summary[-1] and "regression" not in summary[-1]
    assert os.path.exists(workflow_dir / "results" / "baseline" / "e2e" / "e2e-ref.json")


@pytest.mark.e2e
def test_cluster_dry_run_one_pinned_health_job_per_node(workflow_dir):
    """Through the SLURM profile: one health job per listed node, pinned with --nodelist, results
    under that node's name, the report after them (h6 runs the real multi-node cluster test)."""
    pytest.importorskip("snakemake_executor_plugin_slurm")
    from conftest import snakemake

    (workflow_dir / "nodes.yaml").write_text(yaml.safe_dump(
        {"fleet": {"nodes": ["gpu01", "gpu02", "gpu03"]}, "devices": {"gpus": 8}}))
    p = snakemake(workflow_dir, "-n", "--profile", "workflow/profiles/slurm", "--configfile",
                  "workflow/presets/health.yaml", "nodes.yaml", "--slurm-no-account",
                  env={"GPULAB_HOST": "login"})
    out = p.stdout + p.stderr
    for node in ("gpu01", "gpu02", "gpu03"):
        assert f"slurm_extra=--nodelist={node} --exclusive" in out
        assert f"GPULAB_HOST={node}" in out and f"results/transfer/{node}/main.h5" in out
    jobs = {ln.split()[0]: int(ln.split()[1]) for ln in out.splitlines()
            if len(ln.split()) == 2 and ln.split()[1].isdigit()}
    assert jobs.get("health_node") == 3 and jobs.get("report") == 1
    assert "probe" not in jobs and "results/probe/login.h5" not in out  # the login node measures nothing


def _probe_result(root: Path, host: str, model="NVIDIA H200", width=16, throttle=0x1, ecc=0,
                  links_up=18) -> None:
    from gpulab import results

    r = results.Result("probe", "main", {}, "cuda")
    r.attrs["has_gpus"] = True
    r.add_table("gpus", pd.DataFrame([
        {"index": i, "name": model, "pcie_gen_now": 5, "pcie_width_now": width if i == 1 else 16,
         "sm_clock_max_mhz": 1980, "throttle_reasons": throttle if i == 1 else 0x1,
         "ecc_uncorrected_volatile": ecc if i == 1 else 0} for i in range(2)]))
    r.add_table("nvlinks", pd.DataFrame([{"gpu": g, "link": k, "active": k < (links_up if g == 1 else 18)}
                                         for g in range(2) for k in range(18)]))
    os.environ["GPULAB_HOST"] = host
    try:
        results.write(r, root / "probe" / f"{host}.h5")
    finally:
        del os.environ["GPULAB_HOST"]


def test_probe_state_of_a_sick_node_is_flagged_per_gpu(tmp_path):
    """A GPU whose link trained at x8, with a thermal slowdown, ECC errors and a dead NVLink."""
    for h in ("a", "b", "c", "d"):
        _probe_result(tmp_path, h)
    _probe_result(tmp_path, "sick", width=8, throttle=0x1 | 0x40, ecc=3, links_up=17)
    _probe_result(tmp_path, "other", model="NVIDIA H100", width=8)  # another model: not compared
    samples = metmod.find(tmp_path)
    assert set(samples["group"]) == {"cuda: NVIDIA H200", "cuda: NVIDIA H100"}
    s = fl.suspects(fl.deviations(samples))
    assert set(s["host"]) == {"sick"}
    assert set(s["metric"]) == {"probe/gpu=1/pcie_width_now", "probe/gpu=1/clock_slowdown_reasons",
                                "probe/gpu=1/ecc_uncorrected_volatile", "probe/gpu=1/nvlinks_active"}


def test_metric_samples_follow_the_stage_conventions(tmp_path):
    """GB/s per sample = bytes moved / seconds; us per copy = seconds / copies; TFLOP/s = 2MNK/s;
    derived floats (hybrid's speedup) stay out of a metric's name."""
    from gpulab import results
    from gpulab.transfer.measure import bandwidth_row, latency_row

    r = results.Result("transfer", "main", {}, "cuda", attrs={"device_names": ["NVIDIA H200"]})
    r.add_table("host_device", pd.DataFrame([
        bandwidth_row([0.01, 0.02], 10**9, direction="H2D", memory="pinned", call="async", device=0,
                      bytes=10**8, copies=10, verified=True, clock="cuda events")]))
    r.add_table("p2p", pd.DataFrame([latency_row([2e-4, 4e-4], 100, test="latency", metric="latency_gpu",
                                                 mechanism="ce", p2p="enabled", src=0, dst=1, bytes=16)]))
    r.add_table("hybrid", pd.DataFrame([{**bandwidth_row([0.5], 10**9, path="split", src=0, dst=1,
                                                        bytes=10**9, ratio_R=0.25),
                                         "speedup_vs_best_single": 1.2345}]))
    g = results.Result("gemm", "main", {}, "cuda", attrs={"device_name": "NVIDIA H200"})
    g.add_table("single", pd.DataFrame([{"M": 1000, "N": 1000, "K": 500, "dtype": "bf16",
                                         "time_s_samples": json.dumps([1e-3, 2e-3])}]))
    os.environ["GPULAB_HOST"] = "h"
    try:
        results.write(r, tmp_path / "transfer" / "h" / "main.h5")
        results.write(g, tmp_path / "gemm" / "h" / "main.h5")
    finally:
        del os.environ["GPULAB_HOST"]
    s = metmod.find(tmp_path)
    assert set(s["group"]) == {"cuda: NVIDIA H200"}
    by = {m: list(x["value"]) for m, x in s.groupby("metric")}
    assert by["transfer/host_device/H2D/pinned/async/device=0/bytes=100000000"] == pytest.approx([100.0, 50.0])
    assert by["transfer/p2p/latency/latency_gpu/ce/enabled/src=0/dst=1/bytes=16"] == pytest.approx([2.0, 4.0])
    assert by["transfer/hybrid/split/src=0/dst=1/bytes=1000000000/ratio_R=0.25"] == pytest.approx([2.0])
    assert by["gemm/single/bf16/1000x1000x500"] == pytest.approx([1.0, 0.5])
    assert set(s.loc[s["unit"] == "us", "better"]) == {"lower"}
