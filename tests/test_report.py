"""The paper-style report, built from synthetic results of two hosts (stages arrive over time, so the
framework is tested with sections and results made here), checked in headless Chromium and as PDF."""
from __future__ import annotations

import importlib
import pkgutil
import re
import sys
import types
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
import seaborn as sns  # noqa: E402

from gpulab import limits, outcomes, probe, results, seedref  # noqa: E402
from gpulab.outcomes import Bar  # noqa: E402
from gpulab.probe import nvsmi  # noqa: E402
from gpulab.report import browser, build_report, cli, references, sections  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures"
HOSTS = ("gpuhost", "cpuhost")
needs_chromium = pytest.mark.skipif(browser.find_chromium() is None,
                                    reason="Chromium is not installed (Debian: apt-get install chromium)")


# --- synthetic results -----------------------------------------------------------------------------

def _probe_info(host: str) -> dict:
    """What the probe would collect on a 2x H200 NVLink host, or on a CPU-only host."""
    gpu = host == "gpuhost"
    gpus = [{"index": i, "name": "NVIDIA H200", "compute_capability": "9.0", "sm_count": 132,
             "memory_bytes": 150_000_000_000, "pci_bus_id": f"0000:0{i}:00.0", "numa_node": 0}
            for i in range(2)] if gpu else []
    topo = nvsmi.parse_topology((FIXTURES / "topo_nv4.txt").read_text()) if gpu else None
    return {"host": {"cpu_model": f"Test CPU of {host}", "physical_cores": 8, "logical_cpus": 16,
                     "usable_cpus": 16, "numa_nodes": [{"node": 0, "cpus": "0-15", "mem_bytes": 2**34}],
                     "ram_bytes": 2**36, "os": "Debian 12", "kernel": "6.1", "python": "3.11"},
            "software": {"torch": "2.13.0", "python": "3.11", **({"nccl": "2.28.9"} if gpu else {})},
            "gpus": gpus, "has_gpus": gpu, "peer_access": [[0, 1], [1, 0]] if gpu else [],
            "peer_access_api": "cudaDeviceCanAccessPeer" if gpu else "none", "topology": topo,
            "topo_text": "", "nvlink_status_smi": [], "nvlink_caps_smi": []}


def _bench_result(host: str) -> results.Result:
    """A stage 'fakebench' result: bandwidth against size, a matrix and a performance bar."""
    kind = "cuda" if host == "gpuhost" else "cpu"
    r = results.Result("fakebench", "main", {"sizes": [1024, 2**20]}, kind)
    rng = np.random.default_rng(7)
    sizes = 2 ** np.arange(10, 24, 2)
    peak = 4000.0 if kind == "cuda" else 20.0
    r.add_table("bandwidth", pd.DataFrame({
        "size_bytes": np.repeat(sizes, 3), "repetition": np.tile([0, 1, 2], len(sizes)),
        "gbps": np.repeat(peak * sizes / (sizes + 2**18), 3) * rng.uniform(0.97, 1.0, 3 * len(sizes))}),
        units={"size_bytes": "B", "gbps": "GB/s"})
    r.add_matrix("p2p", rng.uniform(10, 50, (2, 2)), "GB/s", rows=["d0", "d1"], cols=["d0", "d1"])
    r.add_table("bars", outcomes.bars_frame([Bar.measure("copy within 5% of torch", peak * 0.9, peak,
                                                         source="synthetic reference", threshold=0.95,
                                                         unit="GB/s", note="synthetic")]))
    return r


def _fake_section(name: str = "fakebench", broken: str | None = None) -> types.ModuleType:
    """A section module following the contract (or one whose hook ``broken`` raises)."""
    mod = types.ModuleType(f"gpulab.report.sections.{name}")
    mod.TITLE = "Fake bandwidth benchmark"
    mod.METHODS = "<p>Bytes counted once per direction; median of 3 repetitions.</p>"

    def render(files, figs):
        if broken == "render":
            raise ZeroDivisionError("synthetic failure in render")
        if broken == "empty":
            return "  "
        df = results.collect(files, "bandwidth")
        fig, ax = plt.subplots(figsize=(5, 3))
        # errorbar=None: a bootstrapped interval is random, and two builds must draw the same figure
        sns.lineplot(data=df, x="size_bytes", y="gbps", hue="host", marker="o", errorbar=None, ax=ax)
        ax.set_xscale("log", base=2)
        return figs.figure(fig, "Bandwidth (GB/s, once per direction) against size (B).") + figs.table(
            df.groupby(["host", "size_bytes"], as_index=False)["gbps"].median(), "Median bandwidth.")

    def headlines(files):
        if broken == "headlines":
            raise KeyError("no such table")
        df = results.collect(files, "bandwidth")
        return [f"Peak {g.gbps.max():.1f} GB/s on {h}" for h, g in df.groupby("host")]

    def references_(files):
        df = results.collect(files, "bandwidth")
        return pd.DataFrame([{"metric": f"peak bandwidth on {h}", "measured": g.gbps.max(),
                              "reference": 4800.0, "source": "H200 datasheet"}
                             for h, g in df.groupby("host")])

    mod.render, mod.headlines, mod.references = render, headlines, references_
    return mod


@pytest.fixture(scope="module")
def two_hosts(tmp_path_factory) -> list[Path]:
    """Probe and fakebench results of two hosts, as if copied into one results/ folder."""
    root = tmp_path_factory.mktemp("results")
    mp = pytest.MonkeyPatch()
    files = []
    try:
        for host in HOSTS:
            mp.setenv("GPULAB_HOST", host)
            files.append(results.write(probe.build_result("probe", "main", {"gpus": "all"},
                                                          _probe_info(host)), root / f"probe/{host}.h5"))
            files.append(results.write(_bench_result(host), root / f"fakebench/{host}/main.h5"))
    finally:
        mp.undo()
    return files


@pytest.fixture
def fake_section(monkeypatch):
    def install(**kw):
        mod = _fake_section(**kw)
        monkeypatch.setitem(sys.modules, mod.__name__, mod)
        return mod
    install()
    return install


@pytest.fixture(scope="module")
def built(two_hosts, tmp_path_factory):
    """The report of the two hosts, with the fake section, written as HTML and figure PNGs."""
    mp = pytest.MonkeyPatch()
    mod = _fake_section()
    mp.setitem(sys.modules, mod.__name__, mod)
    out = tmp_path_factory.mktemp("report")
    try:
        b = build_report(two_hosts, "Test report", figures_dir=out / "figures")
    finally:
        mp.undo()
    (out / "report.html").write_text(b.html)
    return b, out


# --- reference data --------------------------------------------------------------------------------

def test_a5000_reference_is_the_seed_output_parsed():
    m = references.a5000_p2p()
    assert m["uni_ce_p2p_enabled_GBps"].loc["0", "1"] == 52.71
    assert m["uni_ce_p2p_disabled_GBps"].loc["1", "0"] == 21.23
    assert m["bi_ce_p2p_enabled_GBps"].loc["1", "0"] == 101.85
    assert m["latency_ce_p2p_disabled_gpu_us"].loc["0", "1"] == 12.65
    assert m["latency_ce_p2p_enabled_cpu_us"].loc["1", "1"] == 3.40
    # The package copy is the seed text the parser fixture holds.
    fixture = seedref.parse((FIXTURES / "p2pBandwidthLatencyTest_a5000.txt").read_text())
    assert all((fixture[k] == m[k].to_numpy()).all() for k in m) and len(m) == 8
    s = references.a5000_p2p_summary().set_index("metric")
    assert s.loc["GPU-GPU, P2P on (bi)", "value"] == pytest.approx((101.57 + 101.85) / 2)


def test_the_a5000_run_is_parsed_and_packaged_once_with_one_link_name():
    """The transfer stage and the report read the seed's run through one parser: one file in the
    package, one source string naming the link, in the report's summary and the stage's matrices."""
    import gpulab

    copies = [p for p in Path(gpulab.__file__).parent.rglob("*.txt") if "a5000" in p.name.lower()]
    assert copies == [seedref.SEED_FILE]
    assert set(references.a5000_p2p_summary()["source"]) == {seedref.SEED_SOURCE}
    assert seedref.LINK in seedref.SEED_SOURCE
    # a parser of the tool's output matches its headings ("P2P=Enabled Latency") with a regex, or
    # opens the packaged file by name
    parsers = [p for p in Path(gpulab.__file__).parent.rglob("*.py") if p != Path(seedref.__file__)
               and any(("P2P=" in ln and "re." in ln) or "a5000.txt" in ln.lower()
                       for ln in p.read_text().splitlines())]
    assert parsers == [], "another module parses p2pBandwidthLatencyTest output"


def test_datasheet_rows_are_the_limits_table():
    h200 = references.datasheet("NVIDIA H200")
    assert h200["memory bandwidth"] == (4800.0, "GB/s")
    assert h200["bf16 dense peak"][0] == limits.peak_tflops("NVIDIA H200", "bf16").value
    assert h200["NVLink per direction"][0] == 450.0
    assert references.datasheet("NVIDIA RTX A5000")["fp32 dense peak"][0] == 27.8
    assert references.datasheet("Intel Xeon") == {}
    ds = references.datasheets()
    gen5 = ds[ds["gpu"] == "PCIe Gen5 x16"].iloc[0]
    assert gen5["value"] == pytest.approx(63.0, abs=0.1) and "PCI-SIG" in gen5["source"]
    assert not ds["source"].eq("").any()


def test_references_fraction_is_measured_over_reference():
    df = references.normalize_references(pd.DataFrame(
        {"metric": ["a", "b"], "measured": [2.0, 3.0], "reference": [4.0, 0.0], "source": ["x", "y"]}))
    assert df["fraction"].iloc[0] == 0.5 and np.isnan(df["fraction"].iloc[1])
    with pytest.raises(ValueError, match=r"lacks column\(s\) \['reference'\]"):
        references.normalize_references(pd.DataFrame({"metric": ["a"], "measured": [1], "source": ["x"]}))


# --- the report ------------------------------------------------------------------------------------

def _section(html: str, sid: str) -> str:
    m = re.search(rf'<section id="{sid}">(.*?)</section>\n?(?=<section id="|</body>)', html, re.S)
    assert m, f"no section {sid}"
    return m.group(1)


@pytest.mark.slow
def test_report_has_the_chapters_of_a_paper(built):
    b, _ = built
    assert b.errors == []
    ids = re.findall(r'<section id="([\w-]+)">', b.html)
    assert ids == ["abstract", "findings", "system", "methods", "results", "stage-fakebench", "comparison", "fleet", "provenance"]
    abstract = _section(b.html, "abstract")
    # Headline numbers are generated per host by the section, with the device kind beside them.
    assert re.search(r"Peak 3\d{3}\.\d GB/s on gpuhost", abstract) and "Peak 1" in abstract
    assert "cuda on gpuhost" in abstract and "cpu on cpuhost" in abstract
    assert "Bytes counted once per direction" in _section(b.html, "methods")


def test_hosts_appear_side_by_side(built):
    b, _ = built
    system = _section(b.html, "system")
    table = re.search(r"<table.*?</table>", system, re.S).group(0)
    header = re.search(r"<thead>.*?</thead>", table, re.S).group(0)
    assert "gpuhost" in header and "cpuhost" in header  # one column per host
    assert "2x NVIDIA H200" in table and "none (CPU virtual devices)" in table
    assert "NV4" in system  # the topology matrix of the GPU host
    assert re.search(r"Peer access on gpuhost", system)
    assert re.search(r"<td>nccl</td>\s*<td>-</td>\s*<td>2.28.9</td>", system)  # cpuhost, gpuhost


def test_figures_and_tables_are_numbered_and_kept_as_png(built):
    b, out = built
    nums = [int(n) for n in re.findall(r"<b>Figure (\d+)\.</b>", b.html)]
    assert nums == list(range(1, b.figures + 1)) and b.figures >= 4
    assert [int(n) for n in re.findall(r"<b>Table (\d+)\.</b>", b.html)] == list(range(1, b.tables + 1))
    pngs = sorted((out / "figures").glob("fig*.png"))
    assert len(pngs) == b.figures and all(p.read_bytes()[:4] == b"\x89PNG" for p in pngs)


def test_comparison_has_bars_references_datasheets_and_a5000(built):
    b, _ = built
    comp = _section(b.html, "comparison")
    assert "copy within 5% of torch" in comp  # bars of both hosts
    assert comp.count("copy within 5% of torch") == 2
    assert "synthetic reference" in comp and comp.count("<td>fail</td>") >= 2  # source, verdict shown
    assert "peak bandwidth on gpuhost" in comp and "H200 datasheet" in comp
    assert "bf16 dense peak" in comp and "989.5" in comp and "4800" in comp and "PCIe Gen5 x16" in comp
    assert "p2pBandwidthLatencyTest" in comp and "101.7" in comp  # A5000 bidirectional P2P mean


def test_provenance_lists_every_result(built, two_hosts):
    b, _ = built
    prov = _section(b.html, "provenance")
    for f in two_hosts:
        a = results.read_attrs(f)
        assert a["result_id"] in prov and a["config_hash"] in prov
    commit = results.read_attrs(two_hosts[0])["git_commit"]
    assert commit[:12] in prov and "torch" in prov and "2.13.0" in prov


@pytest.mark.slow
def test_a_failing_section_becomes_an_error_box(two_hosts, fake_section):
    fake_section(broken="render")
    b = build_report(two_hosts, "t")
    assert len(b.errors) == 1 and "ZeroDivisionError: synthetic failure in render" in b.errors[0]
    box = re.findall(r'<div class="section-error">(.*?)</div>', _section(b.html, "stage-fakebench"))
    assert box and "fakebench" in box[0] and "ZeroDivisionError" in box[0]
    assert "Test CPU of gpuhost" in b.html and "Appendix: provenance" in b.html  # the rest rendered
    assert 'name="gpulab-section-errors" content="1"' in b.html


@pytest.mark.slow
def test_failing_headlines_and_empty_render_are_reported(two_hosts, fake_section):
    fake_section(broken="headlines")
    b = build_report(two_hosts, "t")
    assert any("headlines: KeyError" in e for e in b.errors)
    assert "section-error" in _section(b.html, "abstract")
    fake_section(broken="empty")
    b = build_report(two_hosts, "t")
    assert b.errors == ["section 'fakebench', render: returned no HTML"]


@pytest.mark.slow
def test_cli_strict_exit_status_and_missing_input(two_hosts, fake_section, tmp_path):
    root = two_hosts[0].parents[1]
    out = tmp_path / "r.html"
    assert cli.main(["--results-dir", str(root), "--out", str(out), "--strict"]) == 0
    assert out.read_text().startswith("<!DOCTYPE html>")
    fake_section(broken="render")
    assert cli.main(["--results-dir", str(root), "--out", str(out), "--strict"]) == 1
    with pytest.raises(SystemExit, match="does not exist"):
        cli.main(["--inputs", str(tmp_path / "nope.h5"), "--out", str(out)])


def test_real_sections_follow_the_contract():
    from gpulab import stages

    names = [f"gpulab.report.sections.{m.name}" for m in pkgutil.iter_modules(sections.__path__)]
    # A stage's section lives with its stage where the registry says so.
    names += [s.section_module() for s in stages.STAGES.values() if s.section_module() not in names]
    assert {"gpulab.probe.section", "gpulab.report.sections.generic"} <= set(names)
    for name in names:
        mod = importlib.import_module(name)
        assert isinstance(mod.TITLE, str) and mod.TITLE, name
        assert isinstance(mod.METHODS, str) and mod.METHODS.strip(), name
        assert callable(mod.render) and callable(mod.headlines), name
        assert not hasattr(mod, "references") or callable(mod.references), name


@pytest.mark.slow
def test_real_probe_section_renders_this_host(tmp_path, monkeypatch):
    monkeypatch.setenv("GPULAB_HOST", "thishost")
    info = probe.collect()
    f = results.write(probe.build_result("probe", "main", {"gpus": "all"}, info), tmp_path / "p.h5")
    b = build_report([f], "t")
    assert b.errors == []
    assert info["host"]["cpu_model"] in _section(b.html, "system")


@pytest.mark.slow
def test_other_hdf5_files_under_results_are_not_reported(two_hosts, tmp_path):
    import h5py

    with h5py.File(tmp_path / "trainset.h5", "w") as f:  # like the data stage's training sets
        f.create_dataset("x", data=np.arange(4))
    b = build_report([two_hosts[0], tmp_path / "trainset.h5"], "t")
    assert b.errors == [] and 'id="stage-' not in b.html and "trainset.h5" not in b.html


@pytest.mark.slow
def test_no_results_still_gives_a_report():
    b = build_report([], "empty")
    assert b.errors == [] and "No probe result" in b.html and "No result files" in b.html


# --- in a real browser, and as PDF -----------------------------------------------------------------

@needs_chromium
def test_report_renders_in_chromium(built):
    b, out = built
    seen = browser.inspect(out / "report.html")
    assert seen["title"] == "Test report" and seen["errors"] == 0
    assert len(seen["images"]) == b.figures
    assert all(i["complete"] and i["naturalWidth"] > 0 and i["naturalHeight"] > 0 for i in seen["images"])
    for s in seen["sections"]:
        assert s["text"] > 40 or s["figures"] or s["tables"], f"section {s['id']} is empty: {s}"
    assert {s["id"] for s in seen["sections"]} >= {"abstract", "system", "methods", "results",
                                                  "comparison", "provenance"}


@pytest.mark.slow  # a real Chromium print: 6 s, the longest test of make check's tier
@needs_chromium
def test_pdf_pages_have_text_and_the_figures(built, tmp_path):
    from pypdf import PdfReader

    b, out = built
    pdf = browser.print_pdf(out / "report.html", tmp_path / "report.pdf")
    reader = PdfReader(pdf)
    assert len(reader.pages) >= 3
    n_images = 0
    for i, page in enumerate(reader.pages, start=1):
        text = page.extract_text() or ""
        images = len(page.images)
        n_images += images
        assert text.strip() or images, f"page {i} of {len(reader.pages)} is blank"
    assert n_images >= b.figures
    first = reader.pages[0].extract_text()
    assert "Test report" in first and "Abstract" in first


@pytest.mark.slow
def test_without_chromium_the_pdf_is_refused_clearly(monkeypatch, tmp_path, two_hosts):
    monkeypatch.setenv("GPULAB_CHROMIUM", "")
    assert browser.find_chromium() is None
    with pytest.raises(browser.ChromiumMissing, match="apt-get install -y chromium"):
        browser.print_pdf(tmp_path / "x.html", tmp_path / "x.pdf")
    with pytest.raises(SystemExit, match="cannot print .*x.pdf: no Chromium found"):
        cli.main(["--inputs", str(two_hosts[0]), "--results-dir", str(tmp_path), "--out",
                  str(tmp_path / "x.html"), "--pdf", str(tmp_path / "x.pdf")])
    assert (tmp_path / "x.html").exists() and not (tmp_path / "x.pdf").exists()


# --- verdicts that say what was judged (issue 24 item 3) ----------------------------------------

def test_abstract_has_one_verdict_line_per_result(built):
    b, _ = built
    abstract = b.html[b.html.index('id="abstract"'):b.html.index('id="system"')]
    lines = re.findall(r'<li class="verdict-[a-z_]+">(.*?)</li>', abstract)
    assert len(lines) == 4  # probe and fakebench on two hosts
    fake = [l for l in lines if l.startswith("<b>fakebench</b> on gpuhost")]
    assert fake == ["<b>fakebench</b> on gpuhost: <b>fail</b>; 1 judged (0 checks, 1 bar), 1 failed, "
                    "0 not applicable (0 bars, 0 other)."]
    assert abstract.index('class="verdicts"') < abstract.index("Key results")


def test_a_result_with_checks_and_no_judged_bar_reads_pass_no_bar_judged():
    from gpulab.outcomes import Check, NotApplicable
    from gpulab.report import verdicts

    long = "needs at least two GPUs with peer access; this host has one " * 3
    tables = {"checks": outcomes.checks_frame([Check.of("sorted", "n=10", True)]),
              "bars": outcomes.bars_frame([Bar.not_applicable("p2p", "one device"),
                                           Bar.not_applicable("p2p bi", "one device"),
                                           Bar.not_applicable("x", long)]),
              "not_applicable": outcomes.not_applicable_frame([NotApplicable("p2p", "one device")])}
    line = verdicts.line_of("sort", "h", "main", tables)
    assert line.verdict == "pass"
    assert line.text.startswith("pass (no bar judged: one device; needs at least two GPUs")
    assert line.text.count("one device") == 1 and len(line.text) < 120  # deduplicated, short
    html = line.html()
    assert "1 judged (1 check, 0 bars), 0 failed, 4 not applicable (3 bars, 1 other)" in html
    nothing = verdicts.line_of("probe", "h", "main", {"not_applicable": tables["not_applicable"]})
    assert nothing.text == "not_applicable (nothing judged: one device)"
    failed = verdicts.line_of("sort", "h", "main", {"checks": outcomes.checks_frame(
        [Check.of("sorted", "n=10", False)]), "bars": tables["bars"]})
    assert failed.text == "fail"


def _bars(n_pass: int, n_fail: int) -> pd.DataFrame:
    rows = [Bar.measure(f"ok {i}", 90, 100, source="s", threshold=0.8, unit="GB/s") for i in range(n_pass)]
    rows += [Bar.measure(f"slow {i}", 10, 100, source="s", threshold=0.8, unit="GB/s") for i in range(n_fail)]
    return outcomes.bars_frame(rows)


def test_bars_tables_show_failed_rows_first_and_never_cut_one():
    from gpulab.kit.html import Figures

    html = Figures().table(_bars(66, 3), "bars of an 8-GPU host")  # default 60 rows
    names = re.findall(r"<td>((?:ok|slow) \d+)</td>", html)
    assert names[:3] == ["slow 0", "slow 1", "slow 2"] and len(names) == 60
    assert "9 more rows in the HDF5 result (none of them failed)" in html
    many = Figures().table(_bars(5, 70), "more failures than rows", max_rows=60)
    assert len(re.findall(r"<td>slow \d+</td>", many)) == 70  # every failed row, past max_rows


def test_comparison_figure_draws_bars_one_row_each_and_other_machines_apart():
    from matplotlib.colors import to_hex

    from gpulab.report import bars_figure

    bars = _bars(1, 1)
    bars.loc[0, "bar"] = "pinned H2D GPU0 cudaMemcpyAsync at the largest size " * 3  # 150 chars
    bars = pd.concat([bars, outcomes.bars_frame([Bar.not_applicable("p2p", "one device")])])
    bars.insert(0, "stage", "transfer")
    bars.insert(1, "host", "h")
    refs_ = pd.DataFrame({"stage": ["transfer"] * 2, "metric": ["copy (GB/s)", "P2P uni GB/s"],
                          "measured": [90.0, 300.0], "reference": [100.0, 50.0],
                          "source": ["datasheet", seedref.SEED_SOURCE], "fraction": [0.9, 6.0]})
    rows, others = bars_figure.bar_rows(bars), bars_figure.other_rows(refs_, bars)
    assert list(rows["verdict"]) == ["fail", "pass"]  # judged bars only, failed first
    assert rows["label"].str.len().max() <= 44
    assert list(others["fraction"]) == [6.0]  # the bar's own reference row is not repeated
    fig = bars_figure.figure(rows, others)
    top, bottom = fig.axes
    assert [to_hex(p.get_facecolor()) for p in top.patches] == [bars_figure.COLOURS["fail"],
                                                               bars_figure.COLOURS["pass"]]
    assert list(top.collections[0].get_offsets()[:, 0]) == [0.8, 0.8]  # each row's threshold
    assert len(bottom.patches) == 1 and "A5000" not in top.get_title()
    plt.close(fig)


# --- the report in fragments (issue 28 item 1) ----------------------------------------------------

def outline(html: str) -> dict:
    """What a reader sees, without the build time: chapters, headings, tables, figure captions,
    the abstract, and the numbers of figures and tables."""
    return {"chapters": re.findall(r'<section id="([^"]+)"><h[23]>([^<]*)</h[23]>', html),
            "headings": re.findall(r"<h3[^>]*>([^<]*)</h3>", html),
            "tables": re.findall(r'<div class="table" id="tab\d+">.*?</table>', html, re.S),
            "figures": re.findall(r'<figure id="fig(\d+)">.*?<figcaption>(.*?)</figcaption>', html, re.S),
            "abstract": html[html.index('id="abstract"'):html.index('id="system"')],
            "errors": re.findall(r'<div class="section-error">.*?</div>', html)}


@pytest.mark.slow
def test_a_report_from_fragments_is_the_monolithic_report(two_hosts, fake_section, tmp_path, monkeypatch):
    from gpulab.report import fragments

    whole = build_report(two_hosts, "t", figures_dir=tmp_path / "whole")
    by_stage = {"probe": two_hosts[0::2], "fakebench": two_hosts[1::2]}
    for stage, files in by_stage.items():  # as the workflow's fragment jobs do, one per stage
        fragments.write(fragments.render(stage, files), tmp_path / "frag" / f"{stage}.json")

    def no_render(stage, files):
        raise AssertionError(f"stage {stage} rendered again although its fragment is current")

    monkeypatch.setattr(fragments, "render", no_render)
    parts = build_report(two_hosts, "t", figures_dir=tmp_path / "parts", fragment_dir=tmp_path / "frag")
    a, b = outline(whole.html), outline(parts.html)
    assert a["tables"] and a["figures"] and a == b
    assert (whole.figures, whole.tables) == (parts.figures, parts.tables)
    assert sorted(p.name for p in (tmp_path / "parts").iterdir()) == [
        f"fig{i:02d}.png" for i in range(1, parts.figures + 1)]
    for p in (tmp_path / "whole").iterdir():  # each figure under its report number
        assert (tmp_path / "parts" / p.name).read_bytes() == p.read_bytes(), p.name


@pytest.mark.slow
def test_a_fragment_of_other_results_or_unreadable_is_rendered_again(two_hosts, fake_section, tmp_path):
    from gpulab.report import fragments

    d = tmp_path / "frag"
    fragments.write(fragments.render("fakebench", two_hosts[1:2]), d / "fakebench.json")  # one host
    (d / "probe.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"probe\.json: unreadable"):
        fragments.Fragment.read(d / "probe.json")
    b = build_report(two_hosts, "t", fragment_dir=d)
    assert outline(b.html) == outline(build_report(two_hosts, "t").html)


def test_fragment_plan_reruns_a_fragment_on_its_own_results_only():
    from gpulab import workflow

    res = ["results/probe/h.h5", "results/kernels/h/a.h5", "results/sort/h/main.h5",
           "results/kernels/h/b.h5", "results/baseline/h/b0.json"]
    plan = workflow.fragment_plan(res, ["probe", "data", "kernels", "sort"])
    assert list(plan) == ["probe", "kernels", "sort"]  # report order; no results, no fragment
    assert plan["kernels"]["own"] == ["results/kernels/h/a.h5", "results/kernels/h/b.h5"]
    assert plan["kernels"]["after"] == ["results/probe/h.h5", "results/sort/h/main.h5"]
    assert plan["sort"]["after"] == ["results/probe/h.h5", "results/kernels/h/a.h5",
                                     "results/kernels/h/b.h5"]


@pytest.mark.slow
def test_chapters_after_the_abstract_come_in_order_and_a_broken_one_is_boxed(two_hosts, fake_section,
                                                                            monkeypatch):
    import gpulab.report as rep

    def broken(frags, files, figs):
        raise RuntimeError("no findings today")

    monkeypatch.setattr(rep, "AFTER_ABSTRACT", [
        ("findings", "Findings", lambda frags, files, figs: f"<p>{len(frags)} chapters</p>"),
        ("more", "More", broken)])
    b = build_report(two_hosts, "t")
    ids = [s for s, _ in outline(b.html)["chapters"]]
    assert ids[:4] == ["abstract", "findings", "more", "system"]
    assert "<p>2 chapters</p>" in b.html and "no findings today" in b.html and len(b.errors) == 1
