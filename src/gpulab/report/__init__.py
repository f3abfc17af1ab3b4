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
from typing import Callable, Iterable

from gpulab import findings, results
from gpulab.report import chapters, damage, fragments, provenance, sections
from gpulab.report import energy as energy_figure
from gpulab.report import fleet as fleet_chapter
from gpulab.kit.html import Figures, error_box, esc, note, page

log = logging.getLogger("gpulab.report")


# Chapters between the abstract and the system under test, in this order: (section id, heading,
# builder(fragments, result files, figures) -> HTML). A builder that raises becomes an error box.
AFTER_ABSTRACT: list[tuple[str, str, Callable]] = [
    # Findings (issue 27): statements derived by named rules of each stage from result rows, and the
    # throughput-vs-energy figure.
    ("findings", "Findings",
     lambda frags, files, figs: findings.findings_html(files) + energy_figure.render(files, figs)),
]


@dataclass
class Built:
    """A built report: the HTML and what went wrong in which section."""

    html: str
    errors: list[str] = field(default_factory=list)
    figures: int = 0
    tables: int = 0
    damaged: list[results.DamagedResult] = field(default_factory=list)


def group_by_stage(files: Iterable[Path],
                   damaged: list[results.DamagedResult] | None = None) -> dict[str, list[Path]]:
    """Whole results by stage; damaged ones go to ``damaged`` (see gpulab.report.damage)."""
    by_stage: dict[str, list[Path]] = defaultdict(list)
    for f, a in results.with_attrs(files, "report", damaged=damaged, whole=True):
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


def build_report(files: Iterable[str | Path], title: str, figures_dir: Path | None = None,
                 fragment_dir: Path | None = None) -> Built:
    """The report of ``files``. Each stage's chapter is a fragment (:mod:`gpulab.report.fragments`):
    taken from ``fragment_dir`` where one was rendered from exactly these results (the workflow's
    per-stage rules), else rendered here."""
    files = sorted({Path(f) for f in files})
    damaged: list[results.DamagedResult] = []
    by_stage = group_by_stage((f for f in files if f.suffix != ".json"), damaged)
    order = [s for s in sections.ORDER + sorted(set(by_stage) - set(sections.ORDER)) if s in by_stage]
    frags = [fragments.load_current(s, by_stage[s], fragment_dir) for s in order]
    return assemble(frags, files, title, figures_dir, damaged)


def assemble(frags: list[fragments.Fragment], files: Iterable[str | Path], title: str,
             figures_dir: Path | None = None,
             damaged: list[results.DamagedResult] | None = None) -> Built:
    """The report from its stages' fragments (in report order) and the chapters around them:
    abstract, methods, comparison, fleet and provenance, read from ``files``. ``damaged``: result
    files that could not be read whole; the abstract names them and the report counts them as
    errors (see gpulab.report.damage)."""
    damaged = list(damaged or [])
    files = sorted({Path(f) for f in files})
    # `gpulab compare --json` tables ride along with the results; they are not HDF5 results.
    comparisons = [f for f in files if f.suffix == ".json"]
    bad = {Path(d.path) for d in damaged}
    files = sorted(f for fs in group_by_stage(
        (f for f in files if f.suffix != ".json" and f not in bad), damaged).values() for f in fs)
    figs = Figures(out_dir=figures_dir)
    probe = [f for f in frags if f.stage == "probe"]
    stages = [f for f in frags if f.stage != "probe"]
    probe_files = [f for f in files if str(results.read_attrs(f).get("stage")) == "probe"]

    ch = _Chapters()
    frame = sections.Section("report", None)  # errors of the report's own chapters
    ch.add("abstract", "Abstract", damage.abstract_note(damaged) + _chapter(
        lambda: chapters.abstract(frags, probe_files, files), frame, frags, "headlines"))
    for sid, heading, make in AFTER_ABSTRACT:
        ch.add(sid, heading, _chapter(lambda: make(frags, files, figs), frame))

    if probe:
        body = figs.adopt(probe[0].body, probe[0].items, probe[0].pngs)
    else:
        body = note("No probe result: the hardware and software of the system under test are unknown. "
                    "Run the probe rule (snakemake probe) on each host.")
    ch.add("system", "1. System under test", body)
    ch.add("methods", "2. Methods", _chapter(lambda: chapters.methods(frags, "2"), frame, frags,
                                             "methods"))

    res = []
    for i, frag in enumerate(stages, start=1):
        res.append(f'<section id="stage-{esc(frag.stage)}"><h3>3.{i} {esc(frag.title)}</h3>'
                   f"<p class='meta'>{frag.n_files} result file(s): {esc(frag.devices)}.</p>"
                   f"{figs.adopt(frag.body, frag.items, frag.pngs)}</section>")
    ch.add("results", "3. Results", "\n".join(res) or note(
        "No stage results yet: only the probe ran. Run `snakemake --cores all` for the full pipeline."))
    ch.add("comparison", "4. Comparison with reference figures", _chapter(
        lambda: chapters.comparison(stages, files, _gpu_names(probe_files), figs, "4"), frame,
        frags, "references"))

    ch.add("fleet", "5. Fleet and baselines", _chapter(
        lambda: fleet_chapter.fleet_section(files, figs), frame))
    for i, comp in enumerate(comparisons, start=1):
        heading, body = fleet_chapter.baseline_section(comp, figs)
        ch.add(f"baseline-{i}", f"5.{i} {heading}", body)

    commit, dirty = results.git_state()
    built_by = {"at": results.now_iso(), "git": commit[:12] + ("+dirty" if dirty else ""),
                "python": platform.python_version()}
    ch.add("provenance", "Appendix: provenance", _chapter(
        lambda: provenance.render(files, figs, built_by), frame))

    errors = [e for f in frags for e in f.all_errors()] + frame.errors + damage.errors(damaged)
    hosts = sorted({str(results.read_attrs(f).get("host")) for f in files})
    head = (f"<h1>{esc(title)}</h1><p class='meta'>Generated {esc(built_by['at'])} from {len(files)} "
            f"result file(s), host(s): {esc(', '.join(hosts) or 'none')}; {figs.figure_no} figures, "
            f"{figs.table_no} tables.</p>")
    if errors:
        head += error_box("the report", f"{len(errors)} section error(s); see the boxes below.")
    html = page(title, head + ch.toc_html() + "\n".join(ch.html),
                meta={"gpulab-section-errors": len(errors), "gpulab-results": len(files),
                      "gpulab-damaged-results": len(damaged)})
    return Built(html, errors, figs.figure_no, figs.table_no, damaged)


def _chapter(fn, frame: sections.Section, frags: list[fragments.Fragment] = (), phase: str = "") -> str:
    """Run a chapter builder; the errors the stages' hooks of ``phase`` recorded become boxes under
    its HTML. A chapter that raises itself (bad data in a result) is recorded under 'report'."""
    try:
        body = fn()
    except Exception as exc:  # noqa: BLE001 - one broken chapter must not take the report down
        frame._record("chapter", exc)
        body = error_box("the report framework", exc)
    return body + "".join(f.boxes(phase) for f in frags if phase)


def build(files: Iterable[str | Path], title: str) -> str:
    """The report's HTML (see :func:`build_report`)."""
    return build_report(files, title).html
