import copy

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


def _settings_classes():
    from gpulab import stages

    return {name: spec.settings_class() for name, spec in stages.STAGES.items()}


def test_every_stage_has_a_typed_view_whose_fields_are_its_schema_keys_and_types():
    classes = _settings_classes()
    assert all(classes.values()), [n for n, c in classes.items() if c is None]
    for name, cls in classes.items():
        assert config.settings_drift(cls, config.schema(name)) == [], name


def test_a_schema_key_without_a_field_or_of_another_type_is_drift():
    cls = _settings_classes()["kernels"]
    sch = copy.deepcopy(config.schema("kernels"))
    sch["properties"]["spare"] = {"type": "integer", "default": 1}
    sch["properties"]["split"]["properties"]["extra"] = {"type": "boolean", "default": False}
    sch["properties"]["divisor"] = {"type": "number", "default": 3}
    sch["properties"]["variants"]["items"] = {"type": "integer"}
    del sch["properties"]["block"]
    assert sorted(config.settings_drift(cls, sch)) == [
        "block: a field of Settings, not in the schema",
        "divisor: the schema allows (float), the field is (int)",
        "spare: in the schema, no field of Settings",
        "split.extra: in the schema, no field of Split",
        "variants: the schema allows (tuple of (int)), the field is (tuple of (str))"]


def test_a_typed_view_is_frozen_with_tuples_and_nested_views_and_goes_back_to_the_section():
    import dataclasses

    cls = _settings_classes()["data"]
    section = config.validate_section("data", {"inputs": [{"path": "x.csv"}]})
    view = cls.from_section(section)
    assert view.tabular_rows == (2000, 10000) and view.image_shape == (3, 16, 16)
    assert view.train.tabular_classes == 4
    assert view.inputs[0].path == "x.csv" and view.inputs[0].label == "label"
    assert view.inputs[0].format is None  # optional, no default
    with pytest.raises(dataclasses.FrozenInstanceError):
        view.seed = 1
    back = view.as_section()
    assert back == {**section, "inputs": [{"path": "x.csv", "label": "label", "format": None}]}
    gemm = _settings_classes()["gemm"].from_section(config.validate_section("gemm", {}))
    assert gemm.sizes == ((512, 512, 512), (768, 256, 512)) and gemm.per_device.size == 0


def test_gpulab_config_explain_prints_every_key_with_type_default_and_description(capsys):
    from gpulab import cli

    assert cli.main(["config", "--explain", "kernels"]) == 0
    out = capsys.readouterr().out.splitlines()
    keys = [line.split(":")[0] for line in out if not line.startswith(" ")]
    sch = config.schema("kernels")["properties"]
    assert keys == ["kernels"] + [p for k, v in sch.items()
                                  for p in [f"kernels.{k}"] + [f"kernels.{k}.{c}" for c in
                                                               v.get("properties", {})]]
    i = out.index("kernels.split.chunks: integer; default 4")
    assert out[i + 1] == "    sub-chunks per device in the pipelined mode (the serial mode uses 1)"
    assert "kernels.gpus: \"all\" | integer; default \"all\"" in out  # from common.schema.yaml
    # The whole config: every section, every key described.
    assert cli.main(["config", "--explain"]) == 0
    everything = capsys.readouterr().out
    assert "devices.nodes.master_port: integer | null; default null" in everything
    assert "data.inputs[].label: string; default \"label\"" in everything
    assert "(no description)" not in everything
    assert cli.main(["config", "--explain", "kernel"]) == 2
    assert "no config section 'kernel'" in capsys.readouterr().err


def test_repo_config_holds_only_values_that_depart_from_the_schema_defaults():
    # Defaults live in the schemas only: a key of config.yaml that restates one would go stale
    # when the schema's default changes.
    raw = yaml.safe_load((REPO / "config.yaml").read_text())
    defaults = config.validate({})

    def restated(mine, dflt, path=()):
        for k, v in mine.items():
            if isinstance(v, dict) and isinstance(dflt.get(k), dict):
                yield from restated(v, dflt[k], path + (k,))
            elif dflt.get(k) == v:
                yield ".".join(path + (k,))

    assert list(restated(raw, defaults)) == []
