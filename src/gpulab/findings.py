"""Findings: short statements a reader can act on, each derived by a named rule from result rows.

A rule lives with its stage (``gpulab.<stage>.findings``, a module-level ``RULES`` list). It gets one
host's rows of its stage (:class:`Rows`) and returns a :class:`Finding` (the statement, its numbers,
the rows it came from and the condition under which it holds), a :class:`NotMeasurable` (its inputs
do not exist on this host, with the reason), or a list of them. A finding that speaks about a bar
names it (``bar``) and the verdict it implies (``claim``); :func:`contradictions` checks that no
finding says the opposite of its bar, and :func:`derive` drops any that would (logged, listed).
"""
from __future__ import annotations

import importlib
import importlib.util
from html import escape as esc
import logging
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import pandas as pd

from gpulab import outcomes, results

log = logging.getLogger("gpulab.findings")


@dataclass
class Finding:
    rule: str
    statement: str
    numbers: dict[str, float]
    rows: list[dict]  # {"stage", "table", "host", "keys": {...}}: where the numbers come from
    condition: str
    host: str = ""
    bar: str | None = None  # the bar this finding speaks about, if any
    claim: str | None = None  # the verdict the statement implies for that bar (pass / fail)


@dataclass
class NotMeasurable:
    rule: str
    reason: str
    host: str = ""


@dataclass
class Rows:
    """One host's result files of one stage; tables read on demand (with host/variant columns)."""

    stage: str
    host: str
    files: list[Path]
    _cache: dict = field(default_factory=dict)

    def table(self, name: str) -> pd.DataFrame:
        if name not in self._cache:
            self._cache[name] = results.collect(self.files, name)
        return self._cache[name]

    def attrs(self) -> list[dict]:
        return [results.read_attrs(f) for f in self.files]

    def ref(self, table: str, **keys) -> dict:
        """A row reference: stage, table, host and the keys that pick the row."""
        return {"stage": self.stage, "table": table, "host": self.host,
                "keys": {k: (v.item() if hasattr(v, "item") else v) for k, v in keys.items()}}


Rule = Callable[[Rows], "Finding | NotMeasurable | list | None"]


def stage_rules(stage: str) -> list[Rule]:
    """The rules of ``gpulab.<stage>.findings`` (none when the stage has no such module)."""
    name = f"gpulab.{stage}.findings"
    try:
        if importlib.util.find_spec(name) is None:
            return []
    except ModuleNotFoundError:
        return []
    return list(getattr(importlib.import_module(name), "RULES", []))


def rule_name(rule: Rule) -> str:
    """'<stage>.<function>' for a rule of gpulab.<stage>.findings, else the function's name."""
    parts = rule.__module__.split(".")
    return f"{parts[1]}.{rule.__name__}" if len(parts) > 2 else rule.__name__


def apply(rules: Iterable[Rule], rows: Rows) -> tuple[list[Finding], list[NotMeasurable]]:
    found, missing = [], []
    for rule in rules:
        try:
            out = rule(rows)
        except Exception as exc:  # noqa: BLE001 - a broken rule is reported, the others still run
            log.exception("findings: rule %s failed on %s", rule_name(rule), rows.host)
            missing.append(NotMeasurable(rule_name(rule), f"the rule failed: {exc!r}", rows.host))
            continue
        for item in out if isinstance(out, list) else [out]:
            if item is None:
                continue
            item.host = item.host or rows.host
            (found if isinstance(item, Finding) else missing).append(item)
    return found, missing


def contradictions(found: Iterable[Finding], files: Iterable[Path]) -> list[str]:
    """Findings whose claim differs from the verdict of the bar they name (same host)."""
    bars = results.collect(list(files), outcomes.BARS)
    out = []
    for f in found:
        if not f.bar:
            continue
        b = bars[(bars["bar"] == f.bar) & (bars["host"] == f.host)] if len(bars) else bars
        verdicts = set(b["verdict"]) & set(outcomes.JUDGED) if len(b) else set()
        if verdicts and f.claim not in verdicts:
            out.append(f"{f.rule} on {f.host}: says {f.claim!r}, bar {f.bar!r} is "
                       f"{'/'.join(sorted(verdicts))}")
    return out


def derive(files: Iterable[str | Path], stages: Iterable[str] | None = None
           ) -> tuple[list[Finding], list[NotMeasurable]]:
    """Every rule of every stage on every host's results; contradicting findings are dropped."""
    from gpulab import stages as registry

    by: dict[tuple[str, str], list[Path]] = defaultdict(list)
    hosts: set[str] = set()
    for f, a in results.with_attrs([Path(p) for p in files], "findings"):
        by[(str(a["stage"]), str(a.get("host")))].append(f)
        hosts.add(str(a.get("host")))
    found, missing = [], []
    for stage in stages or registry.ORDER:
        rules = stage_rules(stage)
        for host in sorted(hosts):
            if not rules:
                break
            if (stage, host) not in by:
                missing += [NotMeasurable(rule_name(r), f"no {stage} result on this host", host)
                            for r in rules]
                continue
            f_, m_ = apply(rules, Rows(stage, host, sorted(by[(stage, host)])))
            found += f_
            missing += m_
    bad = contradictions(found, [p for ps in by.values() for p in ps])
    if bad:
        log.error("findings: dropped %d finding(s) that contradict their bar: %s", len(bad), bad)
        drop = {b.split(" on ")[0] + "@" + b.split(" on ")[1].split(":")[0] for b in bad}
        found = [f for f in found if f"{f.rule}@{f.host}" not in drop]
    return found, missing


def _rows_text(rows: list[dict]) -> str:
    return "; ".join(f"{r['stage']}/{r['table']} "
                     + ", ".join(f"{k}={v}" for k, v in r["keys"].items()) for r in rows)


def findings_html(files: Iterable[str | Path]) -> str:
    """The Findings chapter's HTML (inner): one item per finding, then what is not measurable."""
    found, missing = derive(files)
    parts = []
    if found:
        items = "".join(
            f"<li><b>{esc(f.statement)}</b><br><span class='meta'>[{esc(f.host)}] rule "
            f"<code>{esc(f.rule)}</code>; condition: {esc(f.condition)}; from: "
            f"{esc(_rows_text(f.rows))}</span></li>" for f in found)
        parts.append(f"<ol class='findings'>{items}</ol>")
    else:
        parts.append("<p>No rule found its inputs in these results.</p>")
    if missing:
        items = "".join(f"<li>[{esc(m.host)}] <code>{esc(m.rule)}</code>: not measurable here: "
                        f"{esc(m.reason)}</li>" for m in missing)
        parts.append(f"<details><summary>Not measurable here ({len(missing)})</summary>"
                     f"<ul>{items}</ul></details>")
    return "\n".join(parts)


def energy_rule(rule: str, rows: Rows, work_unit: str):
    """The resolved energy rows of a stage's ``energy`` table (gpulab.energy) as findings; an
    unresolved or not-applicable row is 'not measurable here' with its note."""
    df = rows.table("energy")
    if df.empty:
        return NotMeasurable(rule, "no energy table in the result")
    df = df[df["work_unit"] == work_unit]
    out = []
    for r in df.itertuples():
        if str(r.resolved) not in ("True", "true", "1"):
            out.append(NotMeasurable(rule, f"{r.operation}: {r.note or 'unresolved'}"))
            continue
        out.append(Finding(
            rule, f"{r.operation} on {r.device} costs {r.per_op:.3g} {r.per_op_unit} "
                  f"({r.efficiency:.4g} {r.efficiency_unit} at {r.throughput:.4g} "
                  f"{r.throughput_unit}, {r.avg_W:.0f} W average)",
            {"per_op": float(r.per_op), "efficiency": float(r.efficiency),
             "throughput": float(r.throughput), "avg_W": float(r.avg_W),
             "duration_s": float(r.duration_s)},
            [rows.ref("energy", operation=r.operation, device=r.device)],
            f"{r.meter} energy counter around {r.duration_s:.2f} s of back-to-back operations"))
    return out or NotMeasurable(rule, f"no {work_unit} row in the energy table")
