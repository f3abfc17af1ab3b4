import pytest
import yaml

from conftest import REPO
from gpulab import config


def test_repo_config_is_valid_and_defaults_fill_in():
    cfg = config.load([REPO / "config.yaml"])
    assert cfg["devices"]["backend"] in ("auto", "cuda", "cpu")
    assert cfg["probe"]["gpus"] == "all"


@pytest.mark.parametrize("preset", sorted((REPO / "workflow" / "presets").glob("*.yaml")),
                         ids=lambda p: p.name)
def test_presets_are_valid(preset):
    config.load([REPO / "config.yaml", preset])


def test_error_names_file_line_and_key(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("devices:\n  backend: auto\n  cpu_devices: -3\n")
    with pytest.raises(config.ConfigError) as e:
        config.load([REPO / "config.yaml", bad])
    msg = str(e.value)
    assert f"{bad}:3" in msg and "devices.cpu_devices" in msg and "minimum" in msg


def test_unknown_key_is_rejected_with_its_location(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("probe:\n  gpus: all\n  gpu_count: 3\n")
    with pytest.raises(config.ConfigError,
                       match=r"bad.yaml:3: key 'probe.gpu_count' is not a known key \(did you mean 'gpus'\?\)"):
        config.load([REPO / "config.yaml", bad])


def test_misspelled_section_points_at_its_own_line_and_suggests_the_section(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("devices:\n  backend: auto\n\n# transfer settings\ntranfer:\n  repeats: 3\n")
    with pytest.raises(config.ConfigError,
                       match=r"bad.yaml:5: key 'tranfer' is not a known key \(did you mean 'transfer'\?\)"):
        config.load([REPO / "config.yaml", bad])


def test_yaml_syntax_error_names_file_line_and_key(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("devices:\n  backend: auto\n  cpu_devices: [2\n\nprobe:\n  gpus: all\n")
    with pytest.raises(config.ConfigError, match=r"bad.yaml:3:\d+: not valid YAML at key 'cpu_devices'"):
        config.load([bad])


def test_command_line_values_get_yaml_types_and_errors_name_the_command_line():
    # What Snakemake hands over for --config 'devices={"gpus": 8, "backend": cpu}' (BaseLoader).
    cfg = config.load([REPO / "config.yaml"])
    typed = config.apply_overrides(cfg, {"devices": {"gpus": "8", "backend": "cpu"}, "host_label": "n1"})
    assert cfg["devices"]["gpus"] == 8 and cfg["devices"]["cpu_devices"] == 2 and cfg["host_label"] == "n1"
    config.validate(cfg, None, [REPO / "config.yaml"], command_line=typed)
    typed = config.apply_overrides(cfg, {"devices": {"gpus": "eight"}})
    with pytest.raises(config.ConfigError, match=r"^invalid configuration:\n  command line \(--config\): "
                                                   r"key 'devices.gpus'"):
        config.validate(cfg, None, [REPO / "config.yaml"], command_line=typed)


def test_wrong_enum_says_what_was_expected(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"devices": {"backend": "tpu"}}))
    with pytest.raises(config.ConfigError, match=r"devices.backend.*expected: auto"):
        config.load([bad])


def test_invalid_yaml_is_reported(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("devices: [unclosed\n")
    with pytest.raises(config.ConfigError, match="not valid YAML"):
        config.load([bad])


def test_defaults_fill_in_through_stage_schema_refs():
    cfg = config.validate({})
    assert cfg["probe"] == {"gpus": "all"}  # from probe.schema.yaml, reached through a $ref
    assert cfg["devices"]["nodes"]["nnodes"] == 1


def test_stage_section_alone_gets_defaults_and_named_errors():
    assert config.validate_section("probe", {}) == {"gpus": "all"}
    with pytest.raises(config.ConfigError, match=r"key 'probe.gpus'"):
        config.validate_section("probe", {"gpus": 0})
    assert config.validate_section("no_such_stage", {"x": 1}) == {"x": 1}


@pytest.mark.slow
def test_script_run_by_hand_validates_its_section(tmp_path):
    import subprocess
    import sys

    p = subprocess.run([sys.executable, str(REPO / "scripts" / "probe.py"), "--config-json",
                        '{"stage": {"gpus": "some"}}', "--out", str(tmp_path / "p.h5")],
                       capture_output=True, text=True)
    assert p.returncode != 0 and "key 'probe.gpus'" in p.stderr
    assert not (tmp_path / "p.h5").exists()
