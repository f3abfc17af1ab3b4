"""Self-contained HTML building blocks: figures are embedded as base64 PNG, tables as HTML."""
from __future__ import annotations

import base64
import html
import io
from dataclasses import dataclass, field

import pandas as pd

CSS = """
body{font-family:Georgia,serif;max-width:1100px;margin:2em auto;padding:0 1em;line-height:1.45;color:#222}
h1,h2,h3{font-family:Helvetica,Arial,sans-serif}
table{border-collapse:collapse;font-size:0.85em;margin:0.8em 0}
th,td{border:1px solid #bbb;padding:3px 7px;text-align:right}
th{background:#eee} td:first-child,th:first-child{text-align:left}
figure{margin:1.2em 0} figure img{max-width:100%} figcaption{font-size:0.9em;color:#444}
.note{background:#f6f6f0;border-left:4px solid #cc9;padding:0.4em 0.8em}
.prov{font-family:monospace;font-size:0.8em}
"""


@dataclass
class Figures:
    """Numbers figures and tables across the whole report."""

    figure_no: int = 0
    table_no: int = 0
    items: list = field(default_factory=list)

    def figure(self, fig, caption: str) -> str:
        self.figure_no += 1
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
        import matplotlib.pyplot as plt

        plt.close(fig)
        data = base64.b64encode(buf.getvalue()).decode()
        return (f'<figure id="fig{self.figure_no}"><img alt="Figure {self.figure_no}" '
                f'src="data:image/png;base64,{data}"/><figcaption><b>Figure {self.figure_no}.</b> '
                f"{html.escape(caption)}</figcaption></figure>")

    def table(self, df: pd.DataFrame, caption: str, max_rows: int = 60, floatfmt: str = "{:.4g}") -> str:
        self.table_no += 1
        shown = df.head(max_rows)
        body = shown.to_html(index=False, border=0, float_format=lambda v: floatfmt.format(v),
                             escape=True)
        more = f"<p><i>{len(df) - max_rows} more rows in the HDF5 result.</i></p>" if len(df) > max_rows else ""
        return (f'<div class="table" id="tab{self.table_no}"><p><b>Table {self.table_no}.</b> '
                f"{html.escape(caption)}</p>{body}{more}</div>")


def esc(s) -> str:
    return html.escape(str(s))


def page(title: str, body: str) -> str:
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{esc(title)}</title>"
            f"<style>{CSS}</style></head><body>{body}</body></html>")
