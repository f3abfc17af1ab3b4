"""Any device count is a real machine (3, 5, 6, 7 GPUs exist): the pipeline runs every stage with
the largest degree each algorithm allows, records the rest as not applicable, and builds its report.
CPU virtual devices, sizes cut to the least work (tests/fixtures/odd/minimal.yaml)."""
import shutil

import pytest

from conftest import FIXTURES, copy_workflow, snakemake
from gpulab import results

pytestmark = pytest.mark.e2e


def test_pipeline_with_an_odd_device_count_builds_its_report(tmp_path):
    """5 devices: odd, and neither tensor parallel (4 heads) nor pipeline parallel (4 stages) can use
    them all. One whole pipeline: each count costs two minutes of process start-ups on 2 cores, and
    the decisions are tested where they are made for every count up to 8 (the degrees in
    tests/test_train.py, three devices included; sorting on 5 and 6 devices in tests/test_sort.py;
    GEMM grids in tests/test_gemm.py)."""
    n = 5
    wf = copy_workflow(tmp_path / "wf")
    shutil.copy(FIXTURES / "odd" / "minimal.yaml", wf / "minimal.yaml")
    snakemake(wf, "--cores", "2", "--configfile", "config.yaml", "minimal.yaml",
              "--config", f"devices={{cpu_devices: {n}}}",
              env={"GPULAB_HOST": "testhost", "GPULAB_GPU_POOL": ""}, timeout=1500)
    html = (wf / "results/report/report.html").read_text()
    assert 'name="gpulab-section-errors" content="0"' in html
    tensor = wf / "results/train/testhost/tensor.h5"
    assert results.read_attrs(tensor)["parallel_degree"] == 4  # largest divisor of n_heads=4 <= 5
    pipeline = results.read_attrs(wf / "results/train/testhost/pipeline.h5")
    assert pipeline["parallel_degree"] == 4  # 2 blocks + embedding + head
    # GEMM ranks [1, 3, 6]: 6 is beyond the devices, a not_applicable row naming how many there are
    na = results.read_table(wf / "results/gemm/testhost/main.h5", "not_applicable")
    assert na["reason"].str.contains(f"{n} cpu device").any(), na
