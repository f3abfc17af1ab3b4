"""Self-contained HTML building blocks: figures are embedded as base64 PNG, tables as HTML.

:class:`Figures` numbers figures and tables across the whole report (the numbers a reader cites).
It can also keep each figure as a PNG file, which `snakemake --report` shows in its own gallery.
"""
from __future__ import annotations

import base64
import html
import io
import re
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from gpulab.outcomes import Verdict

CSS = """
body{font-family:Georgia,serif;max-width:1100px;margin:2em auto;padding:0 1em;line-height:1.45;color:#222}
h1,h2,h3,h4{font-family:Helvetica,Arial,sans-serif}
h1{font-size:1.7em} .meta{color:#555;font-size:0.9em}
table{border-collapse:collapse;font-size:0.85em;margin:0.8em 0}
th,td{border:1px solid #bbb;padding:3px 7px;text-align:right;vertical-align:top}
th{background:#eee} td:first-child,th:first-child{text-align:left}
.table{overflow-x:auto} figure{margin:1.2em 0} figure img{max-width:100%} figcaption{font-size:0.9em;color:#444}
.note{background:#f6f6f0;border-left:4px solid #cc9;padding:0.4em 0.8em}
.section-error{background:#fbeaea;border-left:4px solid #c33;padding:0.4em 0.8em;font-family:monospace;
 font-size:0.85em;white-space:pre-wrap}
.kv td{text-align:left}
.prov{font-family:monospace;font-size:0.75em;overflow-wrap:break-word}
.abstract{background:#f7f7fb;border:1px solid #ddd;padding:0.6em 1em}
nav.toc ol{margin:0.2em 0} nav.toc{font-size:0.9em}
@media print{
 body{max-width:none;margin:0;font-size:10pt}
 table{font-size:7pt} th,td{padding:1px 3px} .table{overflow:visible}
 figure,.table,table,tr{break-inside:avoid}
 h2{break-before:auto;break-after:avoid} h3,h4{break-after:avoid}
 nav.toc{display:none}
}
"""


# A fragment (one stage's chapter, rendered on its own) cannot know its figures' numbers in the
# report: it writes these tokens, and the report replaces them when it assembles the fragments.
TOKEN = re.compile(r"@@gpulab-(fig|tab)-(\d+)@@")


@dataclass
class Figures:
    """Numbers figures and tables across the whole report.

    ``out_dir``: where to keep a PNG copy of every figure (``figNN.png``), or None.
    ``tokens``: number with placeholders (a fragment; see :meth:`adopt`), keeping the PNGs in
    ``pngs`` for the report to number and write.
    """

    out_dir: Path | None = None
    figure_no: int = 0
    table_no: int = 0
    items: list = field(default_factory=list)
    tokens: bool = False
    pngs: list = field(default_factory=list)

    def _no(self, kind: str, n: int) -> str:
        return f"@@gpulab-{kind}-{n}@@" if self.tokens else str(n)

    def figure(self, fig, caption: str) -> str:
        import matplotlib.pyplot as plt

        self.figure_no += 1
        buf = io.BytesIO()
        try:
            fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
        finally:
            plt.close(fig)
        png = buf.getvalue()
        self._keep(png)
        self.items.append(("figure", self.figure_no, caption))
        data = base64.b64encode(png).decode()
        no = self._no("fig", self.figure_no)
        return (f'<figure id="fig{no}"><img alt="Figure {no}" '
                f'src="data:image/png;base64,{data}"/><figcaption><b>Figure {no}.</b> '
                f"{html.escape(caption)}</figcaption></figure>")

    def _keep(self, png: bytes) -> None:
        if self.tokens:
            self.pngs.append(png)
        elif self.out_dir is not None:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            (self.out_dir / f"fig{self.figure_no:02d}.png").write_bytes(png)

    def table(self, df: pd.DataFrame, caption: str, max_rows: int = 60, floatfmt: str = "{:.4g}",
              css_class: str = "") -> str:
        self.table_no += 1
        self.items.append(("table", self.table_no, caption))
        shown = shown_rows(df, max_rows)
        body = shown.to_html(index=False, border=0, float_format=lambda v: floatfmt.format(v),
                             escape=True, classes=css_class or None, na_rep="")
        left = len(df) - len(shown)
        more = (f"<p><i>{left} more rows in the HDF5 result (none of them failed).</i></p>"
                if left else "")
        no = self._no("tab", self.table_no)
        return (f'<div class="table" id="tab{no}"><p><b>Table {no}.</b> '
                f"{html.escape(caption)}</p>{body}{more}</div>")

    def adopt(self, body: str, items: list, pngs: list[bytes]) -> str:
        """Number a fragment's figures and tables after the ones so far: its tokens become report
        numbers, its figures count here (and are written to ``out_dir``)."""
        offset = {"fig": self.figure_no, "tab": self.table_no}
        for kind, n, caption in items:
            if kind == "figure":
                self.figure_no += 1
                self._keep(pngs[n - 1])
            else:
                self.table_no += 1
            self.items.append((kind, offset["fig" if kind == "figure" else "tab"] + n, caption))
        return TOKEN.sub(lambda m: str(offset[m.group(1)] + int(m.group(2))), body)


def shown_rows(df: pd.DataFrame, max_rows: int) -> pd.DataFrame:
    """The rows a table shows: in a table with a ``verdict`` column, failed rows first (in their
    order) and every one of them, however many; then the other rows up to ``max_rows`` in all.
    A reader must never miss a failure because the table was cut or sorted it out of sight."""
    if "verdict" not in df.columns:
        return df.head(max_rows)
    failed = df["verdict"].astype(str) == Verdict.FAIL
    return pd.concat([df[failed], df[~failed].head(max(0, max_rows - int(failed.sum())))])


def esc(s) -> str:
    return html.escape(str(s))


def note(text: str) -> str:
    return f'<p class="note">{esc(text)}</p>'


def error_box(where: str, exc: BaseException | str) -> str:
    """The visible trace of a section that failed; the rest of the report still renders."""
    what = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
    return f'<div class="section-error">Error in {esc(where)}: {esc(what)}</div>'


def page(title: str, body: str, meta: dict | None = None) -> str:
    heads = "".join(f'<meta name="{esc(k)}" content="{esc(v)}">' for k, v in (meta or {}).items())
    return (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>{heads}<title>{esc(title)}</title>"
            f"<style>{CSS}</style></head><body>{body}</body></html>")
