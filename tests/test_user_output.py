"""What a user reads: log files, the start line of a job, figure layout on one-GPU hosts."""
import subprocess
import sys

import matplotlib

matplotlib.use("Agg")
import pandas as pd  # noqa: E402

from conftest import REPO  # noqa: E402
from gpulab import results  # noqa: E402
from gpulab.kit.html import Figures  # noqa: E402


def _stage_log(env_extra: dict, devices: dict) -> str:
    code = ("import json, logging, sys\n"
            "from gpulab.stage import stage_main\n"
            "def run(ctx):\n"
            "    logging.getLogger('gpulab.x').info('%s 12345.6 GB/s', 'a' * 120)\n"
            "    sys.exit(0)\n"
            f"stage_main('probe', run, argv=['--config-json', json.dumps({{'devices': {devices!r}}}),"
            " '--out', 'x.h5'])\n")
    import os

    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={**os.environ, **env_extra}, check=True)
    return p.stderr


def test_log_file_lines_are_neither_wrapped_nor_split_and_say_which_devices():
    err = _stage_log({"CUDA_VISIBLE_DEVICES": ""}, {"backend": "auto", "cpu_devices": 3})
    assert any(ln.endswith("a" * 120 + " 12345.6 GB/s") for ln in err.splitlines()), err
    assert "devices visible: no GPU; 3 CPU virtual devices" in err


def _captured_figures():
    class Capture(Figures):
        def figure(self, fig, caption):
            fig.canvas.draw()
            self.drawn = fig
            return ""

    return Capture()


def _overlap(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def test_one_gpu_heatmap_titles_do_not_overlap(tmp_path):
    from gpulab.transfer import section as sec
    from gpulab.transfer.matrices import matrix_title

    r = results.Result("transfer", "main", {}, "cuda")
    for name, (test, mech, p2p) in zip(sec.BW_ORDER[:4], [("uni", "ce", "disabled"), ("uni", "ce", "enabled"),
                                                          ("bi", "ce", "disabled"), ("bi", "ce", "enabled")]):
        r.add_matrix(name, [[1234.5]], "GB/s", rows=["GPU0"], cols=["GPU0"],
                     title=matrix_title(test, mech, p2p, "bandwidth"))
    f = results.write(r, tmp_path / "t.h5")
    figs = _captured_figures()
    sec._heatmaps(f, sec.BW_ORDER, figs, "Bandwidth matrices (GB/s)", ".4g")
    renderer = figs.drawn.canvas.get_renderer()
    boxes = [ax.title.get_window_extent(renderer) for ax in figs.drawn.axes if ax.get_title()]
    assert len(boxes) == 4
    assert not any(_overlap(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1:])


def test_fraction_figure_legend_covers_no_bar():
    from gpulab.report import bars_figure

    bars = pd.DataFrame({"stage": ["transfer", "gemm", "sort"], "host": "h", "bar": ["h2d", "bf16", "keys"],
                         "measured": [95.0, 102.0, 99.0], "reference": [100.0] * 3,
                         "ratio": [0.95, 1.02, 0.99], "threshold": [0.75, 0.9, 0.5],
                         "verdict": ["pass", "pass", "fail"]})
    others = pd.DataFrame({"label": ["transfer: P2P uni vs A5000"], "fraction": [6.0], "source": ["seed"]})
    fig = bars_figure.figure(bars_figure.bar_rows(bars), others)
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        legend = ax.get_legend()
        bars_ = [p.get_window_extent(renderer) for p in ax.patches if p.get_width() > 0]
        assert bars_ and (legend is None or not any(_overlap(legend.get_window_extent(renderer), b)
                                                    for b in bars_))


def test_readme_stage_script_and_launch_check_commands_name_the_venv():
    text = (REPO / "README.md").read_text()
    assert ".venv/bin/python scripts/probe.py --help" in text
    assert ".venv/bin/python -m gpulab.launch_check" in text
    assert "\npython scripts/" not in text
