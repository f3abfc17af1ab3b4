"""The ``gpulab export``, ``gpulab bundle`` and ``gpulab readme-table`` verbs (registered by
:func:`gpulab.cli.parser`; each sets ``args.run``)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpulab import results


def add_parsers(sub, common) -> None:
    e = sub.add_parser(
        "export", help="every result table as one tidy long table (Parquet, CSV, JSON Lines) or "
                       "the health metrics for Prometheus",
        description="One row per measured value: stage, table, metric, keys, value, unit, "
                    "statistic, host, GPU model, commit, config hash, time. --format prom writes "
                    "the health metrics and verdicts for node_exporter's textfile collector.")
    common(e)
    e.add_argument("--out", type=Path, default=Path("results/export/results"),
                   help="output path without suffix (default: results/export/results)")
    e.add_argument("--format", action="append", choices=["parquet", "csv", "jsonl", "prom"],
                   help="repeatable; default: parquet, csv and jsonl")
    e.add_argument("--stage", action="append", help="only this stage (repeatable)")
    e.add_argument("--host", action="append", help="only this host (repeatable)")
    e.add_argument("--since", help="only results written at or after this ISO date/time (UTC)")
    e.set_defaults(run=cmd_export)

    b = sub.add_parser("bundle", help="one .tar.gz of a run (report, export, config, baselines, "
                                      "results) with a sha256 manifest; --verify checks one")
    common(b)
    b.add_argument("path", type=Path, nargs="?", default=Path("results/bundle.tar.gz"),
                   help="the bundle to write or verify (default: results/bundle.tar.gz)")
    b.add_argument("--verify", action="store_true", help="check the bundle against its manifest")
    b.add_argument("--config", action="append", type=Path,
                   help="config file(s) used (default: config.yaml; repeatable)")
    b.add_argument("--baselines-dir", type=Path, default=Path("baselines"))
    b.add_argument("--report-dir", type=Path, help="default: RESULTS_DIR/report")
    b.set_defaults(run=cmd_bundle)

    t = sub.add_parser("readme-table", help="the README's run table from a committed export",
                       description="Print (or --update/--check in README.md) the table of a run's "
                                   "bars, generated from its export (docs/runs/<date>-<gpu>/).")
    t.add_argument("export", type=Path, help="an export file (.parquet, .csv or .jsonl)")
    t.add_argument("--update", type=Path, metavar="README", help="rewrite the block in README")
    t.add_argument("--check", type=Path, metavar="README",
                   help="exit 1 when README's block differs from the export")
    t.set_defaults(run=cmd_readme_table)


def cmd_export(args) -> int:
    from gpulab import export

    formats = args.format or ["parquet", "csv", "jsonl"]
    files = results.find_results(args.results_dir)
    try:
        if "prom" in formats:
            from gpulab import export_prom

            chosen = [f for f, _ in export.select(list(results.with_attrs(files, "export")),
                                                  args.stage, args.host, args.since)]
            p = export_prom.write(chosen, args.out.with_name(args.out.name + ".prom"))
            print(f"wrote {p}")
        rest = [f for f in formats if f != "prom"]
        if rest:
            df = export.tidy(files, args.stage, args.host, args.since)
            for p in export.write(df, args.out, rest):
                print(f"wrote {p}: {len(df)} rows")
    except export.ExportError as exc:
        print(f"gpulab export: {exc}", file=sys.stderr)
        return 2
    return 0


def cmd_bundle(args) -> int:
    from gpulab import bundle

    if args.verify:
        problems = bundle.verify(args.path)
        for p in problems:
            print(f"gpulab bundle: {p}", file=sys.stderr)
        if not problems:
            m = bundle.manifest(args.path)
            print(f"{args.path}: {len(m['files'])} files verified (commit {m['commit'][:12]}, "
                  f"host {m['host']})")
        return 1 if problems else 0
    try:
        p = bundle.create(args.path, args.results_dir, args.config or [Path("config.yaml")],
                          args.baselines_dir, args.report_dir)
    except bundle.BundleError as exc:
        print(f"gpulab bundle: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {p}: {len(bundle.manifest(p)['files'])} files")
    return 0


def cmd_readme_table(args) -> int:
    from gpulab import export, readme_table

    try:
        if args.check:
            same = readme_table.update(args.check, args.export, check=True)
            if not same:
                print(f"{args.check}: the table of {args.export} differs; run gpulab readme-table "
                      f"{args.export} --update {args.check}", file=sys.stderr)
            return 0 if same else 1
        if args.update:
            readme_table.update(args.update, args.export)
            print(f"updated {args.update}")
            return 0
        print(readme_table.block(args.export))
    except export.ExportError as exc:
        print(f"gpulab readme-table: {exc}", file=sys.stderr)
        return 2
    return 0

