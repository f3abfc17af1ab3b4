"""What a user meets on the command line: overrides, config errors, their own input files.
Dry runs only (seconds each)."""
import os
import re
import shlex
import time

import pytest

from conftest import REPO, planned_rules, snakemake

pytestmark = pytest.mark.e2e
ENV = {"GPULAB_HOST": "testhost", "GPULAB_GPU_POOL": ""}


def _readme_command(start: str, section: str = "## Clusters") -> list[str]:
    """A command of the README's code blocks in ``section`` (continuation lines joined), as argv."""
    text = REPO.joinpath("README.md").read_text().replace("\\\n", " ")
    text = text[text.index(section):]
    line = next(ln for ln in text.splitlines() if ln.strip().startswith(start))
    return shlex.split(line.split("  #")[0])


def test_readme_slurm_command_runs_as_written(workflow_dir):
    argv = _readme_command("snakemake --profile workflow/profiles/slurm")
    p = snakemake(workflow_dir, *argv[1:], "--dry-run", env=ENV)
    assert "collectives_variant" in p.stdout  # GPU variants planned: devices.gpus=8 was an int


def test_command_line_override_is_typed_and_its_errors_blame_the_command_line(workflow_dir):
    plan = planned_rules(workflow_dir, "collectives", "--config", "devices={gpus: 2}", env=ENV)
    assert plan.get("collectives_variant") == 4  # every NCCL path variant: 2 GPUs counted
    p = snakemake(workflow_dir, "--dry-run", "--config", "devices={gpus: two}", env=ENV, check=False)
    assert p.returncode != 0
    assert "command line (--config): key 'devices.gpus'" in p.stderr + p.stdout


def test_misspelled_key_and_yaml_errors_name_file_line_and_key(workflow_dir):
    cfg = workflow_dir / "config.yaml"
    good = cfg.read_text() + "\ndevices:\n  cpu_devices: 2\n"
    lines = good.splitlines()
    n = next(i for i, ln in enumerate(lines) if ln.startswith("  cpu_devices:")) + 1
    cfg.write_text(good.replace("  cpu_devices: 2", "  cpu_device: 2"))
    p = snakemake(workflow_dir, "--dry-run", env=ENV, check=False)
    assert f"config.yaml:{n}: key 'devices.cpu_device' is not a known key (did you mean 'cpu_devices'?)" \
        in p.stderr + p.stdout
    cfg.write_text(good.replace("  cpu_devices: 2", "  cpu_devices: [2"))
    p = snakemake(workflow_dir, "--dry-run", env=ENV, check=False)
    assert re.search(rf"config.yaml:{n}:\d+: not valid YAML at key 'cpu_devices'", p.stderr + p.stdout), \
        p.stderr[-2000:]


def test_own_input_files_are_rule_inputs_and_checked_before_any_job(workflow_dir):
    wf = workflow_dir
    mine = wf / "mine.csv"
    mine.write_text("a,b,label\n1,2,0\n3,4,1\n")
    over = ["--config", "data={inputs: [{path: mine.csv}]}"]
    out = wf / "results" / "data" / "testhost"
    (out / "files").mkdir(parents=True)
    (out / "main.h5").touch()
    target = "results/data/testhost/main.h5"
    snakemake(wf, "--cores", "1", "--touch", target, *over, env=ENV)
    assert planned_rules(wf, target, *over, env=ENV) == {}
    time.sleep(1.1)
    mine.write_text("a,b,label\n5,6,1\n")  # replaced by another valid file: rerun
    assert planned_rules(wf, target, *over, env=ENV) == {"data": 1}
    mine.write_text("a,b\n5,6\n")  # a bad one stops the run before any job starts
    p = snakemake(wf, "--dry-run", *over, env=ENV, check=False)
    assert p.returncode != 0
    assert "config data.inputs: mine.csv, line 1, key 'label'" in p.stderr + p.stdout
    os.utime(mine)


def test_default_profile_loads_and_gpu_cap_on_a_host_without_gpus_says_cpu(workflow_dir):
    p = snakemake(workflow_dir, "--dry-run", "--resources", "gpu=2", env=ENV)
    out = p.stderr + p.stdout
    assert "Using workflow specific profile profiles/default" in out
    assert "--resources gpu=2 but this host has no GPU to use" in out and "every stage runs on CPU" in out
