"""Headless Chromium: print the report to PDF, and look at it the way a reader's browser does.

Chromium is optional. :func:`find_chromium` says where it is ($GPULAB_CHROMIUM, else ``chromium`` /
``chromium-browser`` / ``google-chrome`` on PATH); callers that need it and find none get
:class:`ChromiumMissing` with a message saying how to install it.
"""
from __future__ import annotations

import html
import json
import os
import re
import subprocess
import tempfile
from pathlib import Path

from gpulab.chromium import CANDIDATES, find_chromium

# Everything that would reach the network or a desktop session is off: the report is self-contained.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--hide-scrollbars", "--mute-audio"]


class ChromiumMissing(RuntimeError):
    pass


def _require() -> str:
    exe = find_chromium()
    if not exe:
        raise ChromiumMissing("no Chromium found (looked for $GPULAB_CHROMIUM, "
                              f"{', '.join(CANDIDATES)}); on Debian: apt-get install -y chromium")
    return exe


def _run(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    exe = _require()
    with tempfile.TemporaryDirectory(prefix="gpulab-chromium-") as profile:
        # A fresh profile per run: no state from earlier runs, no lock held by another instance.
        cmd = [exe, *FLAGS, f"--user-data-dir={profile}", *args]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                           env={**os.environ, "HOME": profile})
    if p.returncode != 0:
        raise RuntimeError(f"chromium failed ({p.returncode}): {p.stderr[-2000:]}")
    return p


def print_pdf(html_path: str | os.PathLike, pdf_path: str | os.PathLike, timeout: float = 180) -> Path:
    """Print ``html_path`` to ``pdf_path`` (A4, no header/footer), written atomically."""
    html_path, pdf_path = Path(html_path).resolve(), Path(pdf_path)
    pdf_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = pdf_path.with_name(f".{pdf_path.name}.tmp-{os.getpid()}.pdf")
    try:
        _run(["--no-pdf-header-footer", "--run-all-compositor-stages-before-draw",
              "--virtual-time-budget=20000", f"--print-to-pdf={tmp.resolve()}",
              html_path.as_uri()], timeout)
        if not tmp.exists() or tmp.stat().st_size == 0:
            raise RuntimeError(f"chromium wrote no PDF for {html_path}")
        os.replace(tmp, pdf_path)
    finally:
        tmp.unlink(missing_ok=True)
    return pdf_path


# Runs in the page after load: what a reader would see. Results go into a <pre> that --dump-dom prints.
_PROBE = """
<script>
window.addEventListener('load', function () {
  var imgs = Array.prototype.map.call(document.images, function (i) {
    return {alt: i.alt, complete: i.complete, naturalWidth: i.naturalWidth, naturalHeight: i.naturalHeight};
  });
  var secs = Array.prototype.map.call(document.querySelectorAll('section'), function (s) {
    var h = s.querySelector('h2,h3');
    var heading = h ? h.innerText.length : 0;
    return {id: s.id, text: (s.innerText || '').trim().length - heading,
            figures: s.querySelectorAll('figure').length, tables: s.querySelectorAll('table').length,
            errors: s.querySelectorAll('.section-error').length};
  });
  var out = document.createElement('pre');
  out.id = 'gpulab-inspect';
  out.textContent = JSON.stringify({title: document.title, images: imgs, sections: secs,
                                    errors: document.querySelectorAll('.section-error').length});
  document.body.appendChild(out);
});
</script>
"""


def inspect(html_path: str | os.PathLike, timeout: float = 120) -> dict:
    """Load the report in headless Chromium; return its images (naturalWidth) and sections (text).

    The page is loaded from a copy with a small script added, so the report itself stays script-free.
    """
    text = Path(html_path).read_text()
    probed = text.replace("</body>", _PROBE + "</body>") if "</body>" in text else text + _PROBE
    with tempfile.TemporaryDirectory(prefix="gpulab-inspect-") as d:
        page = Path(d) / "page.html"
        page.write_text(probed)
        p = _run(["--virtual-time-budget=15000", "--dump-dom", page.as_uri()], timeout)
    m = re.search(r'<pre id="gpulab-inspect">(.*?)</pre>', p.stdout, re.S)
    if not m:
        raise RuntimeError("the page's inspection script did not run (no result in the dumped DOM)")
    return json.loads(html.unescape(m.group(1)))
