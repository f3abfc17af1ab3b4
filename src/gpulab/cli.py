"""The ``gpulab`` command: baselines, comparison with a baseline, and the fleet view.

Exit status: 0 fine; 1 a gating metric regressed or a node-state check failed (``compare``), a
host is flagged on a gating metric (``fleet --fail-on-suspect``) or a result is damaged
(``verify``); informational metrics never make it 1; 2 a usage or baseline error (missing file,
wrong version, another GPU model) or a damaged result that ``baseline``/``compare``/``fleet``
cannot read.
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
from gpulab.probe import nodestate

EPILOG = """examples:
  gpulab baseline save h200-ref run1 run2 run3   # three runs -> baselines/h200-ref.yaml
  gpulab baseline save h200-ref --add    # add results/ to it as one more run
  gpulab compare h200-ref                # exit 1 when a gating metric regressed (cron, cluster CI)
  gpulab fleet                           # every host under results/, per GPU model
  gpulab verify                          # exit 1 when a result file is damaged or incomplete
  gpulab config --explain transfer       # every key of a config section: type, default, meaning
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
    s = bsub.add_parser("save", help="write baselines/NAME.yaml from one or more runs' results",
                        description="Each results folder is one run of the same host; with several "
                                    "(or grown by --add) the baseline stores each metric's run-to-run "
                                    "spread, which sets its tolerance in compare.")
    s.add_argument("name", help="baseline name (file baselines/NAME.yaml)")
    s.add_argument("runs", nargs="*", type=Path,
                   help="results folders, one run each (default: --results-dir)")
    _common(s)
    _baselines_dir(s)
    s.add_argument("--force", action="store_true", help="replace an existing baseline file")
    s.add_argument("--add", nargs="*", type=Path, default=None, metavar="RUN",
                   help="add these results folders (none named: --results-dir) to the existing "
                        "baseline NAME as more runs, instead of writing a new one")
    sh = bsub.add_parser("show", help="list a baseline's metrics")
    sh.add_argument("name")
    _baselines_dir(sh)

    c = sub.add_parser(
        "compare", formatter_class=argparse.RawDescriptionHelpFormatter,
        help="compare the current results with a baseline (exit 1 on a gating regression)",
        description="Per metric: ratio of medians, whether the two runs' sample ranges are "
                    "separated (the noise band), the one-sided Mann-Whitney U p-value, and a "
                    "verdict: regression / improvement (separated AND beyond the metric's "
                    "tolerance = max(--tolerance, --k x its run-to-run spread in the baseline)), "
                    "else same. Exit 1 when a gating metric regressed or a node-state check of the "
                    "probe failed (e.g. another process on a GPU); informational metrics are shown "
                    "and never fail.")
    c.add_argument("name", help="baseline name (baselines/NAME.yaml) or a path to a baseline file")
    _common(c)
    _baselines_dir(c)
    c.add_argument("--tolerance", type=float, default=bl.DEFAULT_TOLERANCE,
                   help="floor of each metric's tolerance, as a fraction (default %(default)s = 10%%)")
    c.add_argument("--k", type=float, default=bl.DEFAULT_K,
                   help="tolerance = max(floor, k x the metric's run-to-run spread) (default %(default)s)")
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
    f.add_argument("--fail-on-suspect", action="store_true",
                   help="exit 1 when a host is flagged on a gating metric")

    v = sub.add_parser("verify", help="read every result whole; exit 1 when one is damaged",
                       description="Reads every result file under the results folder whole (every "
                                   "table and matrix) and checks it holds every table its writer "
                                   "recorded. Each damaged file is named with the command that "
                                   "redoes it. Exit 1 on any damage.")
    _common(v)
    cf = sub.add_parser("config", help="explain the config: every key's type, default and meaning",
                        description="Reads the packaged schemas (the one place defaults live).")
    cf.add_argument("--explain", nargs="?", const="", metavar="SECTION", required=True,
                    help="print every key (of SECTION only: a stage, devices, report, fleet, ...) "
                         "with its type, default and description")
    from gpulab import export_cli  # export, bundle and readme-table verbs live in their own module

    export_cli.add_parsers(sub, _common)
    return ap


def _fmt(x: float) -> str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.4g}"


def format_table(df, changes_only: bool = False) -> str:
    rows = df[df["change"] != bl.Change.SAME.value] if changes_only else df
    order = {c.value: i for i, c in enumerate(bl.Change)}
    rows = rows.assign(_o=rows["change"].map(order)).sort_values(["_o", "metric"])
    w = max([len("metric")] + [len(m) for m in rows["metric"]])
    if "cls" not in rows.columns:
        rows = rows.assign(cls="gating", tolerance=math.nan)
    rows = rows.assign(_c=rows["cls"] != "gating").sort_values(["_c", "_o", "metric"])
    out = [f"{'metric':<{w}}  {'class':<5} {'unit':<8} {'baseline':>10} {'current':>10} {'ratio':>7} "
           f"{'tol':>5} {'sep':>3} {'MW p':>7}  change"]
    for r in rows.itertuples():
        tol = "" if not math.isfinite(r.tolerance) else f"{r.tolerance:.0%}"
        out.append(f"{r.metric:<{w}}  {'gate' if r.cls == 'gating' else 'info':<5} {r.unit:<8} "
                   f"{_fmt(r.baseline_median):>10} {_fmt(r.current_median):>10} {_fmt(r.ratio):>7} "
                   f"{tol:>5} {'yes' if r.separated else 'no':>3} {_fmt(r.mannwhitney_p):>7}  {r.change}")
    return "\n".join(out)


def cmd_baseline(args) -> int:
    if args.action == "save":
        if args.add is not None:
            runs = list(args.runs) + list(args.add) or [args.results_dir]
            path = bl.add(runs, args.name, args.baselines_dir, args.host)
        else:
            runs = args.runs or [args.results_dir]
            path = bl.save(runs, args.name, args.baselines_dir, args.host, args.force)
        doc = bl.load(path)
        print(f"wrote {path}: {len(doc['metrics'])} metrics of host {doc['host']} ({doc['group']}), "
              f"{len(doc.get('runs') or [1])} run(s)")
        return 0
    doc = bl.load(args.name, args.baselines_dir)
    print(f"{doc['_path']}: host {doc.get('host')}, {doc['group']}, {len(doc['metrics'])} metrics, "
          f"created {doc.get('created_at')}")
    for m, e in doc["metrics"].items():
        print(f"  {m}: median {e['median']:.4g} {e['unit']} ({e['better']} is better, n={e['n']})")
    return 0


def cmd_compare(args) -> int:
    doc = bl.load(args.name, args.baselines_dir)
    files = results.find_results(args.results_dir)
    current = metmod.collect(files)
    df = bl.compare(doc, current, args.host, args.tolerance, args.k)
    bad_state = nodestate.failures(files, df.attrs["host"])
    df.attrs["node_state"] = [f"{case}: {check.removeprefix('node state: ')} FAILED: {note}"
                              for _, check, case, note in bad_state]
    print(format_table(df, args.changes_only))
    for line in df.attrs["node_state"]:
        print(f"node state: {line}")
    regressed = bl.gating_regressions(df)
    verdict = ("FAIL" if len(regressed) or bad_state else "PASS")
    why = [f"{len(regressed)} gating metric(s) regressed"] if len(regressed) else []
    why += [f"{len(bad_state)} node-state check(s) failed ({nodestate.UNTRUSTWORTHY})"] if bad_state else []
    print(f"health verdict: {verdict}" + (f": {'; '.join(why)}" if why else
                                          ": every gating metric within its tolerance"))
    print(bl.summary_line(df))  # last line: what scripts and the workflow read
    if args.json:
        results.atomic_write_text(args.json, bl.to_json(df))
    return 1 if verdict == "FAIL" and not args.exit_zero else 0


def cmd_fleet(args) -> int:
    st = fl.Settings(args.threshold, args.mad_floor, args.min_hosts)
    files = results.find_results(args.results_dir)
    samples, hygiene = fl.prepare(files)
    dev = fl.deviations(samples, st)
    print(fl.format_text(dev, st, hygiene=hygiene))
    for host, check, case, note in nodestate.failures(files):
        print(f"node state: {host} {case}: {check.removeprefix('node state: ')} FAILED: {note}")
    if args.csv:
        results.atomic_write_text(args.csv, dev.to_csv(index=False))
    return 1 if args.fail_on_suspect and dev["flagged"].any() else 0


def cmd_verify(args) -> int:
    files = results.find_results(args.results_dir)
    good, damaged = results.verify_all(files)
    for d in damaged:
        print(f"DAMAGED {d.path}: {d.why}\n  redo: {d.redo}")
    print(f"gpulab verify: {len(good)} result(s) whole, {len(damaged)} damaged "
          f"(under {args.results_dir}, {len(files) - len(good) - len(damaged)} other HDF5 file(s))")
    return 1 if damaged else 0


def cmd_config(args) -> int:
    from gpulab import config

    try:
        print("\n".join(config.explain(args.explain or None)))
    except config.ConfigError as exc:
        print(f"gpulab config: {exc}", file=sys.stderr)
        return 2
    return 0


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    verbs = {"baseline": cmd_baseline, "compare": cmd_compare, "fleet": cmd_fleet,
             "verify": cmd_verify, "config": cmd_config}
    try:
        if hasattr(args, "run"):  # verbs registered by other modules (gpulab.export_cli)
            return args.run(args)
        return verbs[args.command](args)
    except bl.BaselineError as exc:
        print(f"gpulab {args.command}: {exc}", file=sys.stderr)
        return 2
    except results.DamagedResult as exc:
        print(f"gpulab {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
