"""The provenance appendix: where every number in the report came from.

Git commit and dirty flag, config hash and config, package versions (hosts side by side) and the id
of every result file, all read from the result files' root attributes.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd

from gpulab import results
from gpulab.kit.html import Figures, esc, note


def _short_commit(a: dict) -> str:
    commit = str(a.get("git_commit", "unknown"))
    return (commit[:12] if commit != "unknown" else commit) + ("+dirty" if a.get("git_dirty") else "")


def _rel(path: Path) -> str:
    try:
        return os.path.relpath(path)
    except ValueError:
        return str(path)


def git_summary(attrs: list[dict]) -> str:
    """One sentence: which commit(s) produced the results, and whether the tree was dirty."""
    states = sorted({_short_commit(a) for a in attrs})
    if not states:
        return "No result files."
    dirty = sum(bool(a.get("git_dirty")) for a in attrs)
    which = "commit " + states[0] if len(states) == 1 else f"{len(states)} source states: " + ", ".join(states)
    warn = (f" {dirty} of {len(attrs)} result(s) came from a tree with uncommitted changes (+dirty): "
            "their code is not exactly any commit." if dirty else " Every result came from a clean tree.")
    return f"The results were produced by {which}.{warn}"


def render(files: list[Path], figs: Figures, built_by: dict) -> str:
    attrs = [(f, results.read_attrs(f)) for f in files]
    parts = [f"<p>{esc(git_summary([a for _, a in attrs]))}</p>",
             f"<p>This report was built at {esc(built_by['at'])} by gpulab at "
             f"{esc(built_by['git'])} (Python {esc(built_by['python'])}).</p>"]
    if not attrs:
        return "\n".join(parts) + note("No result files were found, so there is nothing to trace.")

    rows = [{"file": _rel(f), "stage": a.get("stage"), "variant": a.get("variant"), "host": a.get("host"),
             "device kind": a.get("device_kind"), "device ids": a.get("device_ids") or "-",
             "git": _short_commit(a), "config hash": a.get("config_hash"),
             "result id": a.get("result_id"), "finished (UTC)": a.get("finished_at")} for f, a in attrs]
    parts.append(figs.table(pd.DataFrame(rows), "Every result file in this report: its source state "
                            "(git commit, +dirty when the tree had uncommitted changes), config hash "
                            "and unique result id.", max_rows=1000, css_class="prov"))

    cfg = {}
    for _, a in attrs:
        cfg.setdefault((a.get("stage"), a.get("config_hash")), a.get("config"))
    cfg_df = pd.DataFrame([{"stage": s, "config hash": h,
                            "config": json.dumps(c, sort_keys=True) if not isinstance(c, str) else c}
                           for (s, h), c in sorted(cfg.items(), key=lambda kv: str(kv[0]))])
    parts.append(figs.table(cfg_df, "Configuration of each stage (the config slice its jobs saw; the "
                            "hash identifies it in the table above).", max_rows=1000, css_class="prov"))

    pk: dict[str, dict[str, set]] = {}
    for _, a in attrs:
        packages = a.get("packages") or {}
        if isinstance(packages, str):  # an unparsable JSON attribute stays a string
            packages = {"(unparsed)": packages}
        for name, ver in packages.items():
            pk.setdefault(name, {}).setdefault(str(a.get("host")), set()).add(str(ver))
    hosts = sorted({str(a.get("host")) for _, a in attrs})
    pk_df = pd.DataFrame([{"package": n, **{h: " / ".join(sorted(v.get(h, {"-"}))) for h in hosts}}
                          for n, v in sorted(pk.items())])
    parts.append(figs.table(pk_df, "Package versions recorded in the results, hosts side by side "
                            "(a / separates versions that differ between a host's results).",
                            max_rows=200))
    return "\n".join(parts)
