"""One stage's chapter, rendered on its own: a fragment (issue 28).

A fragment holds everything the report takes from a stage's section: its rendered HTML (figures
and tables numbered with tokens, see :class:`gpulab.kit.html.Figures`), headlines, methods,
reference rows and verdict lines, and the errors each hook raised (shown where the report shows that
hook's output). The workflow renders one fragment per stage (`gpulab.report.cli fragment`), so a
change to one stage re-renders one chapter; the report only assembles them. A fragment is JSON, its
figures inside as base64 PNG: one file per stage, written atomically.
"""
from __future__ import annotations

import base64
import json
import logging
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import pandas as pd

from gpulab import results
from gpulab.report import references as refs
from gpulab.report import sections, verdicts
from gpulab.kit.html import Figures, error_box

log = logging.getLogger("gpulab.report")

FORMAT = "gpulab-report-fragment/1"
# The hooks whose errors a fragment keeps apart: each shows in the chapter that shows that hook.
PHASES = ("load", "headlines", "render", "methods", "references")


@dataclass
class Fragment:
    stage: str
    title: str
    result_ids: list[str]   # the results it was rendered from (the report checks they are current)
    devices: str            # "cpu on host-a; cuda on host-b"
    headlines: list[str]
    body: str               # the section's HTML, figure and table numbers as tokens
    methods: str | None
    references: dict | None  # the section's reference rows, DataFrame.to_dict("split")
    verdicts: list[dict]    # verdicts.Line fields, one per result
    errors: dict[str, list[str]] = field(default_factory=dict)
    items: list = field(default_factory=list)   # Figures.items: (kind, local number, caption)
    pngs: list[bytes] = field(default_factory=list)

    @property
    def n_files(self) -> int:
        return len(self.result_ids)

    def references_frame(self) -> pd.DataFrame | None:
        if self.references is None:
            return None
        return pd.DataFrame(self.references["data"], columns=self.references["columns"])

    def verdict_lines(self) -> list[verdicts.Line]:
        return [verdicts.Line(**v) for v in self.verdicts]

    def boxes(self, phase: str) -> str:
        return "".join(error_box(f"stage '{self.stage}'", e) for e in self.errors.get(phase, []))

    def all_errors(self) -> list[str]:
        return [e for p in PHASES for e in self.errors.get(p, [])]

    # --- file form ---
    def to_json(self) -> str:
        d = asdict(self)
        d["pngs"] = [base64.b64encode(p).decode() for p in self.pngs]
        return json.dumps({"format": FORMAT, **d})

    @classmethod
    def read(cls, path: Path) -> "Fragment":
        try:
            d = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"report fragment {path}: unreadable ({exc})") from None
        if not isinstance(d, dict) or d.pop("format", None) != FORMAT:
            raise ValueError(f"report fragment {path}: not a {FORMAT} file")
        missing = {f.name for f in fields(cls)} - set(d)
        if missing:
            raise ValueError(f"report fragment {path}: lacks key(s) {sorted(missing)}")
        d["pngs"] = [base64.b64decode(p) for p in d["pngs"]]
        d["items"] = [tuple(i) for i in d["items"]]
        return cls(**d)


def result_ids(files: list[Path]) -> list[str]:
    return sorted(str(results.read_attrs(f).get("result_id")) for f in files)


def _devices_of(files: list[Path]) -> str:
    kinds: dict[str, set[str]] = {}
    for f in files:
        a = results.read_attrs(f)
        kinds.setdefault(str(a.get("device_kind")), set()).add(str(a.get("host")))
    return "; ".join(f"{k} on {', '.join(sorted(h))}" for k, h in sorted(kinds.items()))


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


def render(stage: str, files: list[Path]) -> Fragment:
    """Render ``stage``'s section over ``files`` (its results, all hosts). Every hook is guarded:
    a failing one becomes an error in its phase, never an exception."""
    files = sorted(Path(f) for f in files)  # the report's order: hosts side by side alike
    sec = sections.Section.load(stage)
    errors: dict[str, list[str]] = {}

    def during(phase: str, fn):
        n = len(sec.errors)
        try:
            return fn()
        finally:
            errors[phase] = sec.errors[n:]

    errors["load"] = list(sec.errors)

    def heads():
        lines = sec.call("headlines", files, default=[], check=sections.CHECK_STR_LIST)
        try:
            vs = [asdict(v) for v in verdicts.lines(files)]
        except Exception as exc:  # noqa: BLE001 - a broken result must not take the report down
            sec._record("verdicts", exc)
            vs = []
        return lines, vs

    headlines, verdict_rows = during("headlines", heads)
    figs = Figures(tokens=True)
    body = during("render", lambda: _guarded(sec, files, figs))
    # _guarded already put the render errors under the body: they are not boxed twice.
    methods = during("methods", lambda: sec.call("METHODS", default=None, check=sections.CHECK_STR))

    def reference_rows():
        df = sec.call("references", files, default=None, check=refs.normalize_references)
        return None if df is None or not len(df) else refs.normalize_references(df).to_dict("split")

    references = during("references", reference_rows)
    if references is not None:
        references.pop("index", None)
    return Fragment(stage, sec.title, result_ids(files), _devices_of(files), list(headlines), body,
                    methods, references, verdict_rows, errors, list(figs.items), list(figs.pngs))


def write(frag: Fragment, path: Path) -> Path:
    results.atomic_write_text(Path(path), frag.to_json())
    return Path(path)


def load_current(stage: str, files: list[Path], fragment_dir: Path | None) -> Fragment:
    """The stage's fragment from ``fragment_dir`` where it was rendered from exactly these results;
    else (none, unreadable, or other results since: a host's results copied in) rendered here."""
    path = None if fragment_dir is None else Path(fragment_dir) / f"{stage}.json"
    if path is not None and path.exists():
        try:
            frag = Fragment.read(path)
        except ValueError as exc:
            log.warning("report: %s; rendering stage '%s' here", exc, stage)
        else:
            if frag.stage == stage and frag.result_ids == result_ids(files):
                return frag
            log.info("report: fragment %s is not of the current results of stage '%s'; "
                     "rendering it here", path, stage)
    return render(stage, files)
