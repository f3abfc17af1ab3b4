"""The offline wheelhouse: build wheels for another Python/platform, install with no index."""
import subprocess
import sys

import pytest

from gpulab import wheelhouse

pytestmark = pytest.mark.e2e  # talks to the package index


def test_platform_tags_include_older_manylinux():
    tags = wheelhouse.platforms_for("manylinux_2_28_x86_64")
    assert tags[0] == "manylinux_2_28_x86_64" and "manylinux_2_17_x86_64" in tags
    assert "manylinux2014_x86_64" in tags
    assert wheelhouse.platforms_for("win_amd64") == ["win_amd64"]


def test_build_for_another_python_then_install_offline(tmp_path):
    # pyyaml is compiled (re-fetched for the target), connection_pool is source-only (built here),
    # six is pure Python (copied).
    reqs = ["PyYAML==6.0.2", "connection_pool==0.0.3", "six==1.16.0"]
    other = wheelhouse.build(reqs, tmp_path / "w312", "3.12", "manylinux_2_28_x86_64")
    names = [w.name for w in other]
    assert any(n.startswith("PyYAML-6.0.2-cp312-cp312-manylinux") for n in names), names
    assert any(n.startswith("connection_pool-0.0.3-py3-none-any") for n in names), names

    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    wheelhouse.build(reqs, tmp_path / "w", here, "manylinux_2_28_x86_64")
    target = tmp_path / "site"
    wheelhouse.install(tmp_path / "w", reqs, target=target)
    out = subprocess.run([sys.executable, "-c", "import yaml, connection_pool, six; print(yaml.__file__)"],
                         env={"PYTHONPATH": str(target)}, capture_output=True, text=True, check=True)
    assert str(target) in out.stdout
