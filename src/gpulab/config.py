"""Config loading and validation with errors that name the file, line and key at fault.

The schema (``workflow/schemas/config.schema.yaml``) refers to one schema file per stage with
relative ``$ref``s; defaults from the schemas are filled in, so rules can rely on every key.
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Iterable, Mapping
from urllib.parse import urlparse
from urllib.request import url2pathname

import jsonschema
import yaml
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_SCHEMA = REPO_ROOT / "workflow" / "schemas" / "config.schema.yaml"


class ConfigError(ValueError):
    pass


def _load_yaml(path: Path) -> Any:
    with open(path) as fh:
        return yaml.safe_load(fh)


def key_lines(path: str | Path) -> dict[tuple, int]:
    """Map each key path in a YAML file, e.g. ('transfer', 'sizes', 2), to its 1-based line."""
    try:
        root = yaml.compose(Path(path).read_text())
    except (OSError, yaml.YAMLError):
        return {}
    lines: dict[tuple, int] = {}

    def walk(node, prefix: tuple):
        lines[prefix] = node.start_mark.line + 1
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                lines[prefix + (k.value,)] = k.start_mark.line + 1
                walk(v, prefix + (k.value,))
                lines[prefix + (k.value,)] = k.start_mark.line + 1
        elif isinstance(node, yaml.SequenceNode):
            for i, v in enumerate(node.value):
                walk(v, prefix + (i,))

    if root is not None:
        walk(root, ())
    return lines


def _validator(schema_path: Path):
    schema = _load_yaml(schema_path)
    schema["$id"] = schema_path.resolve().as_uri()

    def retrieve(uri: str):
        contents = _load_yaml(Path(url2pathname(urlparse(uri).path)))
        # jsonschema's evolve() picks a validator class from a subschema's own $schema, which would
        # drop the default-filling extension below inside every referenced stage schema.
        contents.pop("$schema", None)
        return Resource.from_contents(contents, default_specification=DRAFT202012)

    registry = Registry(retrieve=retrieve).with_resource(schema["$id"], Resource.from_contents(schema))
    base = jsonschema.Draft202012Validator

    def set_defaults(validator, properties, instance, sch):
        if isinstance(instance, dict):
            for prop, sub in properties.items():
                if isinstance(sub, dict) and "default" in sub:
                    instance.setdefault(prop, copy.deepcopy(sub["default"]))
        yield from base.VALIDATORS["properties"](validator, properties, instance, sch)

    cls = jsonschema.validators.extend(base, {"properties": set_defaults})
    return cls(schema, registry=registry)


def _fmt_path(path: Iterable) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "<top level>"


def _locate(path: tuple, files: list[tuple[Path, dict]]) -> str:
    """'file:line' of the deepest part of ``path`` that some config file defines (last file wins)."""
    for n in range(len(path), -1, -1):
        for f, lines in reversed(files):
            if path[:n] in lines and (n or lines):
                return f"{f}:{lines[path[:n]]}"
    return files[-1][0].as_posix() if files else "<config>"


def validate(
    config: dict,
    schema_path: str | Path = DEFAULT_SCHEMA,
    config_files: Iterable[str | Path] = (),
) -> dict:
    """Validate ``config`` in place (defaults filled in); raise ConfigError naming file:line and key."""
    validator = _validator(Path(schema_path))
    errors = sorted(validator.iter_errors(config), key=lambda e: (len(e.path), list(map(str, e.path))))
    if not errors:
        return config
    files = [(Path(f), key_lines(f)) for f in config_files if Path(f).exists()]
    msgs = []
    for e in errors[:10]:
        path = tuple(e.absolute_path)
        expected = e.schema.get("description") if isinstance(e.schema, Mapping) else None
        msg = f"{_locate(path, files)}: key '{_fmt_path(path)}': {e.message}"
        if expected:
            msg += f" (expected: {expected})"
        msgs.append(msg)
    more = f"\n... and {len(errors) - 10} more" if len(errors) > 10 else ""
    raise ConfigError("invalid configuration:\n  " + "\n  ".join(msgs) + more)


def validate_section(stage: str, section: dict, schema_dir: str | Path = DEFAULT_SCHEMA.parent) -> dict:
    """Validate one stage's section (defaults filled in) against ``<stage>.schema.yaml``.

    Stage scripts call this on the section they receive, so a script run by hand with a partial
    ``--config-json`` gets the same defaults and errors as a Snakemake run.
    """
    path = Path(schema_dir) / f"{stage}.schema.yaml"
    if not path.exists():
        return section
    errors = sorted(_validator(path).iter_errors(section), key=lambda e: list(map(str, e.path)))
    if errors:
        msgs = [f"key '{_fmt_path((stage, *e.absolute_path))}': {e.message}" for e in errors[:10]]
        raise ConfigError(f"invalid '{stage}' configuration:\n  " + "\n  ".join(msgs))
    return section


def load(paths: Iterable[str | Path], schema_path: str | Path = DEFAULT_SCHEMA) -> dict:
    """Load and merge config files (later ones override earlier ones, recursively), then validate."""
    merged: dict = {}
    paths = [Path(p) for p in paths]
    for p in paths:
        try:
            data = _load_yaml(p) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{p}: not valid YAML: {exc}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{p}: the top level must be a mapping of stage sections")
        merged = deep_merge(merged, data)
    return validate(merged, schema_path, paths)


def deep_merge(a: Mapping, b: Mapping) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), Mapping) else v
    return out
