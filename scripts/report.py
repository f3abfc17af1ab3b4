"""Render every result into one self-contained HTML report (figures embedded).

Reads the HDF5 files given with --inputs plus any other result already under --results-dir (results
copied from other hosts appear side by side).
"""
import argparse
import logging
from pathlib import Path

from gpulab import report, results
from gpulab.stage import setup_logging


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="scripts/report.py", description=__doc__)
    ap.add_argument("--inputs", nargs="*", default=[], type=Path, help="result files (.h5)")
    ap.add_argument("--results-dir", type=Path, default=Path("results"))
    ap.add_argument("--title", default="gpulab report")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    setup_logging()
    files = set(args.inputs) | set(results.find_results(args.results_dir))
    html = report.build(files, args.title)
    results.atomic_write_text(args.out, html)
    logging.getLogger("gpulab").info("report: wrote %s (%d KiB)", args.out, len(html) // 1024)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
