"""The ``gpulab`` command: baselines, comparison with a baseline, and the fleet view.

Exit status: 0 fine; 1 a regression (``compare``) or a suspect host (``fleet --fail-on-suspect``);
2 a usage or baseline error (missing file, wrong version, another GPU model).
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from gpulab import baseline as bl
from gpulab import fleet as fl
from gpulab import metrics as metmod
from gpulab import results

EPILOG = """examples:
  gpulab baseline save h200-ref          # results/ -> baselines/h200-ref.yaml (commit it)
  gpulab compare h200-ref                # exit 1 when a metric regressed (cron, cluster CI)
  gpulab fleet                           # every host under results/, per GPU model
"""


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--results-dir", type=Path, default=Path("results"),
                   help="results to read (default: results)")


def _baselines_dir(p: argparse.ArgumentParser) -> None:
    p.add_argument("--baselines-dir", type=Path, default=Path("baselines"),
                   help="where baseline files live (default: baselines)")
    p.add_argument("--host", help="the host whose results to use (default: the only host in the "
                                  "results, else this host's label)")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="gpulab", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG,
        description="Did something get slower (baselines), and which node of the fleet is sick "
                    "(fleet)? Reads the HDF5 results under results/.")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")

    b = sub.add_parser("baseline", help="save (or show) a named baseline of the current results",
                       description="Baselines: per-metric medians, ranges and samples of one host's "
                                   "results in a small, diffable YAML file meant to be committed.")
    bsub = b.add_subparsers(dest="action", required=True, metavar="ACTION")
    s = bsub.add_parser("save", help="write baselines/NAME.yaml from the current results")
    s.add_argument("name", help="baseline name (file baselines/NAME.yaml)")
    _common(s)
    _baselines_dir(s)
    s.add_argument("--force", action="store_true", help="replace an existing baseline file")
    sh = bsub.add_parser("show", help="list a baseline's metrics")
    sh.add_argument("name")
    _baselines_dir(sh)

    c = sub.add_parser(
        "compare", formatter_class=argparse.RawDescriptionHelpFormatter,
        help="compare the current results with a baseline (exit 1 on a regression)",
        description="Per metric: ratio of medians, whether the two runs' sample ranges are "
                    "separated (the noise band), the one-sided Mann-Whitney U p-value, and a "
                    "verdict: regression / improvement (separated AND beyond the tolerance), else "
                    "same. Exit 1 when any metric regressed.")
    c.add_argument("name", help="baseline name (baselines/NAME.yaml) or a path to a baseline file")
    _common(c)
    _baselines_dir(c)
    c.add_argument("--tolerance", type=float, default=bl.DEFAULT_TOLERANCE,
                   help="smallest relevant change, as a fraction (default %(default)s = 10%%)")
    c.add_argument("--changes-only", action="store_true", help="print only rows that are not 'same'")
    c.add_argument("--json", type=Path, help="also write the table as JSON (the report reads it)")
    c.add_argument("--exit-zero", action="store_true", help="exit 0 even on a regression")

    f = sub.add_parser("fleet", help="compare hosts of the same GPU model; rank suspect hosts",
                       description=fl.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(f)
    f.add_argument("--threshold", type=float, default=fl.DEFAULT_THRESHOLD,
                   help="robust z beyond which a host is flagged (default %(default)s)")
    f.add_argument("--mad-floor", type=float, default=fl.DEFAULT_MAD_FLOOR,
                   help="floor on the MAD as a fraction of the median (default %(default)s)")
    f.add_argument("--min-hosts", type=int, default=fl.DEFAULT_MIN_HOSTS,
                   help="hosts a group needs before anyone is flagged (default %(default)s)")
    f.add_argument("--csv", type=Path, help="also write every host x metric deviation as CSV")
    f.add_argument("--fail-on-suspect", action="store_true", help="exit 1 when a host is flagged")
    from gpulab import export_cli  # export and bundle verbs (issue 27) live in their own module

    export_cli.add_parsers(sub, _common)
    return ap


def _fmt(x: float) -> str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.4g}"


def format_table(df, changes_only: bool = False) -> str:
    rows = df[df["change"] != bl.Change.SAME.value] if changes_only else df
    order = {c.value: i for i, c in enumerate(bl.Change)}
    rows = rows.assign(_o=rows["change"].map(order)).sort_values(["_o", "metric"])
    w = max([len("metric")] + [len(m) for m in rows["metric"]])
    out = [f"{'metric':<{w}}  {'unit':<8} {'baseline':>10} {'current':>10} {'ratio':>7} "
           f"{'sep':>3} {'MW p':>7}  change"]
    for r in rows.itertuples():
        out.append(f"{r.metric:<{w}}  {r.unit:<8} {_fmt(r.baseline_median):>10} "
                   f"{_fmt(r.current_median):>10} {_fmt(r.ratio):>7} {'yes' if r.separated else 'no':>3} "
                   f"{_fmt(r.mannwhitney_p):>7}  {r.change}")
    return "\n".join(out)


def cmd_baseline(args) -> int:
    if args.action == "save":
        path = bl.save(args.results_dir, args.name, args.baselines_dir, args.host, args.force)
        doc = bl.load(path)
        print(f"wrote {path}: {len(doc['metrics'])} metrics of host {doc['host']} ({doc['group']})")
        return 0
    doc = bl.load(args.name, args.baselines_dir)
    print(f"{doc['_path']}: host {doc.get('host')}, {doc['group']}, {len(doc['metrics'])} metrics, "
          f"created {doc.get('created_at')}")
    for m, e in doc["metrics"].items():
        print(f"  {m}: median {e['median']:.4g} {e['unit']} ({e['better']} is better, n={e['n']})")
    return 0


def cmd_compare(args) -> int:
    doc = bl.load(args.name, args.baselines_dir)
    current = metmod.find(args.results_dir)
    df = bl.compare(doc, current, args.host, args.tolerance)
    print(format_table(df, args.changes_only))
    print(bl.summary_line(df))
    if args.json:
        results.atomic_write_text(args.json, bl.to_json(df))
    regressed = int((df["change"] == bl.Change.REGRESSION.value).sum())
    return 1 if regressed and not args.exit_zero else 0


def cmd_fleet(args) -> int:
    st = fl.Settings(args.threshold, args.mad_floor, args.min_hosts)
    dev = fl.deviations(metmod.find(args.results_dir), st)
    print(fl.format_text(dev, st))
    if args.csv:
        results.atomic_write_text(args.csv, dev.to_csv(index=False))
    return 1 if args.fail_on_suspect and dev["flagged"].any() else 0


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    try:
        if hasattr(args, "run"):  # verbs registered by other modules (gpulab.export_cli)
            return args.run(args)
        return {"baseline": cmd_baseline, "compare": cmd_compare, "fleet": cmd_fleet}[args.command](args)
    except bl.BaselineError as exc:
        print(f"gpulab {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
