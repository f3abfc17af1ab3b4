"""Command line of the report (scripts/report.py): HTML always, PDF and figure PNGs on request."""
from __future__ import annotations

import argparse
import logging
from pathlib import Path

from gpulab import report, results
from gpulab.report import browser, fragments

log = logging.getLogger("gpulab.report")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="scripts/report.py",
        description="Render every result into the paper-style report: self-contained HTML, and a "
                    "PDF printed by headless Chromium. Results under --results-dir from other hosts "
                    "appear side by side.")
    ap.add_argument("--inputs", nargs="*", default=[], type=Path, help="result files (.h5)")
    ap.add_argument("--results-dir", type=Path, default=Path("results"),
                    help="also report every other result file under this folder")
    ap.add_argument("--title", default="gpulab report")
    ap.add_argument("--out", type=Path, required=True, help="the HTML report to write")
    ap.add_argument("--pdf", type=Path, help="also print the report to this PDF (needs Chromium)")
    ap.add_argument("--figures-dir", type=Path,
                    help="also keep every figure as figNN.png here (for snakemake --report)")
    ap.add_argument("--fragment", metavar="STAGE",
                    help="render only this stage's chapter into --out (a JSON fragment the report "
                         "assembles; see gpulab.report.fragments)")
    ap.add_argument("--fragments-dir", type=Path,
                    help="assemble the stages' chapters from the fragments here (<stage>.json), "
                         "rendering only those missing or of other results")
    ap.add_argument("--strict", action="store_true",
                    help="exit with status 1 when a section failed (the report is still written; "
                         "a damaged result file always exits 1)")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    from gpulab.stage import setup_logging

    args = parse_args(argv)
    setup_logging()
    for f in args.inputs:
        if not f.exists():
            raise SystemExit(f"report: input result {f} does not exist")
    files = set(args.inputs) | set(results.find_results(args.results_dir))
    if args.fragment:
        return _fragment(args, files)
    if args.figures_dir:
        args.figures_dir.mkdir(parents=True, exist_ok=True)
        for old in args.figures_dir.glob("fig*.png"):  # figures of an earlier build
            old.unlink()
    built = report.build_report(files, args.title, figures_dir=args.figures_dir,
                                fragment_dir=args.fragments_dir)
    results.atomic_write_text(args.out, built.html)
    log.info("report: wrote %s (%d KiB, %d figures, %d tables, %d section error(s))", args.out,
             len(built.html) // 1024, built.figures, built.tables, len(built.errors))
    for e in built.errors:
        log.error("report: %s", e)
    if args.pdf:
        try:
            browser.print_pdf(args.out, args.pdf)
        except browser.ChromiumMissing as exc:
            raise SystemExit(f"report: cannot print {args.pdf}: {exc}") from None
        log.info("report: wrote %s", args.pdf)
    # A damaged result fails the report (and so Snakemake's report rule) even without --strict: the
    # HTML names it in the abstract, but a report that lacks a chapter must not pass as complete.
    return 1 if built.damaged or (args.strict and built.errors) else 0


def _fragment(args, files) -> int:
    """One stage's chapter from that stage's results (all hosts under --results-dir)."""
    # Another stage's damaged result is the assembly's to report; this stage's own fails this job.
    damaged: list = []
    stage_files = report.group_by_stage((f for f in files if f.suffix != ".json"),
                                        damaged).get(args.fragment, [])
    own = [d for d in damaged if d.stage == args.fragment]
    for d in own:
        log.error("report: %s", d)
    if own:
        return 1
    frag = fragments.render(args.fragment, sorted(stage_files))
    fragments.write(frag, args.out)
    errors = frag.all_errors()
    log.info("report: wrote the fragment of stage '%s' to %s (%d result file(s), %d section "
             "error(s))", args.fragment, args.out, len(stage_files), len(errors))
    for e in errors:
        log.error("report: %s", e)
    return 1 if args.strict and errors else 0
