"""Any device count is a real machine (3, 5, 6, 7 GPUs exist): the pipeline runs every stage with
the largest degree each algorithm allows, records the rest as not applicable, and builds its report.
CPU virtual devices, sizes cut to the least work (tests/fixtures/odd/minimal.yaml)."""
import shutil

import pytest

from conftest import FIXTURES, copy_workflow, snakemake
from gpulab import results

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("n", [3, 6])
def test_pipeline_with_an_odd_or_composite_device_count_builds_its_report(tmp_path, n):
    """3: tensor parallel cannot use them all; 6: neither tensor nor pipeline parallel can. Counts
    up to 8 are covered where they are decided, without a whole pipeline each: the degrees in
    tests/test_train.py, sorting on 5 and 6 devices in tests/test_sort.py, GEMM grids in
    tests/test_gemm.py."""
    wf = copy_workflow(tmp_path / "wf")
    shutil.copy(FIXTURES / "odd" / "minimal.yaml", wf / "minimal.yaml")
    snakemake(wf, "--cores", "2", "--configfile", "config.yaml", "minimal.yaml",
              "--config", f"devices={{cpu_devices: {n}}}",
              env={"GPULAB_HOST": "testhost", "GPULAB_GPU_POOL": ""}, timeout=1500)
    html = (wf / "results/report/report.html").read_text()
    assert 'name="gpulab-section-errors" content="0"' in html
    tensor = wf / "results/train/testhost/tensor.h5"
    assert results.read_attrs(tensor)["parallel_degree"] == {3: 2, 6: 4}[n]  # largest divisor of n_heads=4
    pipeline = results.read_attrs(wf / "results/train/testhost/pipeline.h5")
    assert pipeline["parallel_degree"] == min(n, 4)  # 2 blocks + embedding + head
