"""The report: every result that exists, written up like a systems paper in one self-contained HTML.

Chapters: abstract (each section's headline numbers), the system under test (the probe), methods
(each section's METHODS), results (each stage's section), a comparison with reference figures, and
a provenance appendix. Results are read only through :mod:`gpulab.results`; each stage's section
comes from ``gpulab.report.sections.<stage>`` (a generic table dump where a stage has none). A
section that raises becomes an error box naming the stage and the exception; the rest still renders.
"""
from __future__ import annotations

import logging
import platform
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from gpulab import findings, results
from gpulab.report import chapters, provenance, sections
from gpulab.report import energy as energy_figure
from gpulab.report import fleet as fleet_chapter
from gpulab.report.html import Figures, error_box, esc, note, page

log = logging.getLogger("gpulab.report")


@dataclass
class Built:
    """A built report: the HTML and what went wrong in which section."""

    html: str
    errors: list[str] = field(default_factory=list)
    figures: int = 0
    tables: int = 0


def group_by_stage(files: Iterable[Path]) -> dict[str, list[Path]]:
    by_stage: dict[str, list[Path]] = defaultdict(list)
    for f, a in results.with_attrs(files, "report"):
        by_stage[str(a["stage"])].append(Path(f))
    return by_stage


def _gpu_names(probe_files: list[Path]) -> list[str]:
    names = []
    for f in probe_files:
        if results.read_attrs(f).get("has_gpus"):
            names += [str(n) for n in results.read_table(f, "gpus")["name"]]
    return names


class _Chapters:
    """Numbered <section>s, and the table of contents that lists them."""

    def __init__(self):
        self.html: list[str] = []
        self.toc: list[tuple[str, str]] = []

    def add(self, sid: str, heading: str, body: str) -> None:
        self.toc.append((sid, heading))
        self.html.append(f'<section id="{esc(sid)}"><h2>{esc(heading)}</h2>\n{body}\n</section>')

    def toc_html(self) -> str:
        items = "".join(f'<li><a href="#{esc(s)}">{esc(h)}</a></li>' for s, h in self.toc)
        return f'<nav class="toc"><b>Contents</b><ul>{items}</ul></nav>'


def _guarded(sec: sections.Section, files: list[Path], figs: Figures) -> str:
    """A section's render(), or an error box when it raised or rendered nothing."""
    n_before = len(sec.errors)
    if sec.module is None:
        body = ""
    else:
        body = sec.call("render", files, figs, default="", check=sections.CHECK_STR)
        if not body.strip() and len(sec.errors) == n_before:
            sec.errors.append(f"section '{sec.stage}', render: returned no HTML")
            log.error("report: %s", sec.errors[-1])
    return body + "".join(error_box(f"stage '{sec.stage}'", e) for e in sec.errors[n_before:])


def build_report(files: Iterable[str | Path], title: str, figures_dir: Path | None = None) -> Built:
    files = sorted({Path(f) for f in files})
    # `gpulab compare --json` tables ride along with the results; they are not HDF5 results.
    comparisons = [f for f in files if f.suffix == ".json"]
    files = [f for f in files if f.suffix != ".json"]
    by_stage = group_by_stage(files)
    files = sorted(f for fs in by_stage.values() for f in fs)
    figs = Figures(out_dir=figures_dir)
    order = [s for s in sections.ORDER + sorted(set(by_stage) - set(sections.ORDER)) if s in by_stage]
    loaded = [(sections.Section.load(s), by_stage[s]) for s in order]
    probe = [(s, f) for s, f in loaded if s.stage == "probe"]
    stages = [(s, f) for s, f in loaded if s.stage != "probe"]
    probe_files = by_stage.get("probe", [])

    ch = _Chapters()
    frame = sections.Section("report", None)  # errors of the report's own chapters
    # The abstract needs every section's headlines; it is rendered first so its errors show there.
    abstract_errors = _errors_during(
        loaded, lambda: chapters.abstract(loaded, probe_files, files), frame)
    ch.add("abstract", "Abstract", abstract_errors)
    # Findings (issue 27): statements derived by named rules from result rows, right after it.
    ch.add("findings", "Findings", _errors_during(
        [], lambda: findings.findings_html(files) + energy_figure.render(files, figs), frame))

    if probe:
        sec, pf = probe[0]
        body = _guarded(sec, pf, figs)
    else:
        body = note("No probe result: the hardware and software of the system under test are unknown. "
                    "Run the probe rule (snakemake probe) on each host.")
    ch.add("system", "1. System under test", body)
    ch.add("methods", "2. Methods", _errors_during(loaded, lambda: chapters.methods(loaded, "2"), frame))

    res = []
    for i, (sec, sf) in enumerate(stages, start=1):
        res.append(f'<section id="stage-{esc(sec.stage)}"><h3>3.{i} {esc(sec.title)}</h3>'
                   f"<p class='meta'>{len(sf)} result file(s): {esc(chapters._devices_of(sf))}.</p>"
                   f"{_guarded(sec, sf, figs)}</section>")
    ch.add("results", "3. Results", "\n".join(res) or note(
        "No stage results yet: only the probe ran. Run `snakemake --cores all` for the full pipeline."))
    ch.add("comparison", "4. Comparison with reference figures", _errors_during(
        loaded, lambda: chapters.comparison(stages, files, _gpu_names(probe_files), figs, "4"), frame))

    ch.add("fleet", "5. Fleet and baselines", _errors_during(
        [], lambda: fleet_chapter.fleet_section(files, figs), frame))
    for i, comp in enumerate(comparisons, start=1):
        heading, body = fleet_chapter.baseline_section(comp, figs)
        ch.add(f"baseline-{i}", f"5.{i} {heading}", body)

    commit, dirty = results.git_state()
    built_by = {"at": results.now_iso(), "git": commit[:12] + ("+dirty" if dirty else ""),
                "python": platform.python_version()}
    ch.add("provenance", "Appendix: provenance", _errors_during(
        [], lambda: provenance.render(files, figs, built_by), frame))

    errors = [e for s, _ in loaded for e in s.errors] + frame.errors
    hosts = sorted({str(results.read_attrs(f).get("host")) for f in files})
    head = (f"<h1>{esc(title)}</h1><p class='meta'>Generated {esc(built_by['at'])} from {len(files)} "
            f"result file(s), host(s): {esc(', '.join(hosts) or 'none')}; {figs.figure_no} figures, "
            f"{figs.table_no} tables.</p>")
    if errors:
        head += error_box("the report", f"{len(errors)} section error(s); see the boxes below.")
    html = page(title, head + ch.toc_html() + "\n".join(ch.html),
                meta={"gpulab-section-errors": len(errors), "gpulab-results": len(files)})
    return Built(html, errors, figs.figure_no, figs.table_no)


def _errors_during(loaded, fn, frame: sections.Section) -> str:
    """Run a chapter builder; errors it records in sections become boxes under its HTML.

    A chapter that raises itself (bad data in a result) is recorded too, under the 'report' stage.
    """
    before = {id(s): len(s.errors) for s, _ in loaded}
    try:
        body = fn()
    except Exception as exc:  # noqa: BLE001 - one broken chapter must not take the report down
        frame._record("chapter", exc)
        body = error_box("the report framework", exc)
    boxes = [error_box(f"stage '{s.stage}'", e) for s, _ in loaded for e in s.errors[before[id(s)]:]]
    return body + "".join(boxes)


def build(files: Iterable[str | Path], title: str) -> str:
    """The report's HTML (see :func:`build_report`)."""
    return build_report(files, title).html
