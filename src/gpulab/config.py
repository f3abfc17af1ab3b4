"""Config loading and validation with errors that name the file, line and key at fault.

The schemas ship inside the package and are read with :mod:`importlib.resources`, so an installed
gpulab (a wheel, no checkout) finds them: ``gpulab/config.schema.yaml`` (the top level),
``gpulab/common.schema.yaml`` (definitions the stages share) and ``gpulab/<stage>/schema.yaml`` for
each stage of the registry (:mod:`gpulab.stages`), which also supplies the top level's stage
properties. Defaults from the schemas are filled in, so rules can rely on every key.
"""
from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import json
import re
import textwrap
import types
import typing
from importlib import resources
from pathlib import Path
from typing import Any, Iterable, Mapping
from urllib.parse import urlparse
from urllib.request import url2pathname

import jsonschema
import yaml
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from gpulab import stages

REPO_ROOT = Path(__file__).resolve().parents[2]
# Packaged schemas are known by the id SCHEMA_BASE + "<name>.schema.yaml", whatever file or zip
# member they come from, so the stage schemas' relative $refs ("common.schema.yaml#/$defs/gpus")
# resolve to the packaged common schema. The reserved .invalid domain: nothing is ever fetched.
SCHEMA_BASE = "https://gpulab.invalid/schemas/"


class ConfigError(ValueError):
    pass


# The packaged schemas are read at every Snakemake start (a dozen files); libyaml's safe loader
# reads them ~10x faster than the pure-Python one, which stays the fallback. A user's own files keep
# yaml.safe_load: its error messages are the ones ConfigError quotes.
_FAST_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


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


def schema(name: str = "config") -> dict:
    """The packaged schema ``name``: "config" (the whole file), "common", or a registered stage."""
    if name in ("config", "common", "fleet"):
        text = resources.files("gpulab").joinpath(f"{name}.schema.yaml").read_text()
    else:
        text = stages.get(name).schema_text()
    sch = yaml.load(text, Loader=_FAST_SAFE_LOADER)
    if name == "config":
        for stage in stages.STAGES:
            sch["properties"][stage] = {"$ref": f"{stage}.schema.yaml", "default": {}}
        sch["$defs"]["stage_name"]["enum"] = list(stages.STAGES)
    sch["$id"] = f"{SCHEMA_BASE}{name}.schema.yaml"
    return sch


def _retrieve(uri: str):
    if uri.startswith(SCHEMA_BASE):
        contents = schema(uri[len(SCHEMA_BASE):].removesuffix(".schema.yaml"))
    else:
        contents = _load_yaml(Path(url2pathname(urlparse(uri).path)))
    # jsonschema's evolve() picks a validator class from a subschema's own $schema, which would
    # drop the default-filling extension below inside every referenced stage schema.
    contents.pop("$schema", None)
    return Resource.from_contents(contents, default_specification=DRAFT202012)


def _validator_for(sch: dict):
    registry = Registry(retrieve=_retrieve).with_resource(sch["$id"], Resource.from_contents(sch))
    base = jsonschema.Draft202012Validator

    def set_defaults(validator, properties, instance, subschema):
        if isinstance(instance, dict):
            for prop, sub in properties.items():
                if isinstance(sub, dict) and "default" in sub:
                    instance.setdefault(prop, copy.deepcopy(sub["default"]))
        yield from base.VALIDATORS["properties"](validator, properties, instance, subschema)

    cls = jsonschema.validators.extend(base, {"properties": set_defaults})
    return cls(sch, registry=registry)


@functools.lru_cache(maxsize=None)
def _packaged_validator(name: str):
    return _validator_for(schema(name))


def _validator(which: str | Path | None):
    """Validator for a packaged schema (None: the whole config; a stage's name) or a schema file."""
    if which is None:
        return _packaged_validator("config")
    if isinstance(which, str) and not which.endswith(".yaml"):
        return _packaged_validator(which)
    path = Path(which)
    sch = _load_yaml(path)
    sch["$id"] = path.resolve().as_uri()
    return _validator_for(sch)


def _fmt_path(path: Iterable) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "<top level>"


COMMAND_LINE = "command line (--config)"


def _locate(path: tuple, files: list[tuple[Path, dict]], cli: Iterable[tuple] = ()) -> str:
    """Where the value at ``path`` came from: the command line, or 'file:line' of the deepest part
    of ``path`` that some config file defines (last file wins, as in the merge)."""
    for c in cli:
        if c[:len(path)] == path[:len(c)]:  # one is a prefix of the other
            return COMMAND_LINE
    for n in range(len(path), -1, -1):
        for f, lines in reversed(files):
            if path[:n] in lines and (n or lines):
                return f"{f}:{lines[path[:n]]}"
    return files[-1][0].as_posix() if files else "<config>"


def _unknown_keys(e) -> list[tuple[tuple, str]]:
    """(path of the unknown key, 'did you mean' hint) for an additionalProperties error."""
    known = list((e.schema.get("properties") or {}) if isinstance(e.schema, Mapping) else {})
    inst = e.instance if isinstance(e.instance, Mapping) else {}
    out = []
    for key in inst:
        if key in known:
            continue
        close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.4)
        hint = f"did you mean '{close[0]}'?" if close else f"known keys: {', '.join(known)}"
        out.append((tuple(e.absolute_path) + (key,), hint))
    return out


def _messages(e, files, cli) -> list[str]:
    if e.validator == "additionalProperties" and not isinstance(e.validator_value, Mapping):
        return [f"{_locate(path, files, cli)}: key '{_fmt_path(path)}' is not a known key ({hint})"
                for path, hint in _unknown_keys(e)]
    path = tuple(e.absolute_path)
    expected = e.schema.get("description") if isinstance(e.schema, Mapping) else None
    msg = f"{_locate(path, files, cli)}: key '{_fmt_path(path)}': {e.message}"
    return [msg + (f" (expected: {expected})" if expected else "")]


def validate(
    config: dict,
    schema_path: str | Path | None = None,
    config_files: Iterable[str | Path] = (),
    command_line: Mapping | None = None,
) -> dict:
    """Validate ``config`` in place (defaults filled in); raise ConfigError naming file:line and key.

    ``schema_path``: None for the whole config, a stage's name for its section, or a schema file.
    ``command_line``: the ``--config`` overrides already merged into ``config``, so that an error in
    one of them blames the command line, not the line of a file it replaced.
    """
    validator = _validator(schema_path)
    errors = sorted(validator.iter_errors(config), key=lambda e: (len(e.path), list(map(str, e.path))))
    if not errors:
        return config
    files = [(Path(f), key_lines(f)) for f in config_files if Path(f).exists()]
    cli = _leaf_paths(command_line or {})
    msgs = [m for e in errors for m in _messages(e, files, cli)]
    more = f"\n... and {len(msgs) - 10} more" if len(msgs) > 10 else ""
    raise ConfigError("invalid configuration:\n  " + "\n  ".join(msgs[:10]) + more)


def _leaf_paths(d: Mapping, prefix: tuple = ()) -> list[tuple]:
    out = []
    for k, v in d.items():
        if isinstance(v, Mapping) and v:
            out += _leaf_paths(v, prefix + (k,))
        else:
            out.append(prefix + (k,))
    return out


def typed_overrides(overrides: Mapping) -> dict:
    """``--config`` overrides with YAML types.

    Snakemake reads a nested value (``--config 'devices={gpus: 8}'``) with YAML's BaseLoader, so
    every scalar inside it is a string; each is read again with the normal YAML rules (8 -> int,
    true -> bool, null -> None). Top-level values were already typed by Snakemake and are kept.
    """
    def retype(v):
        if isinstance(v, Mapping):
            return {k: retype(x) for k, x in v.items()}
        if isinstance(v, list):
            return [retype(x) for x in v]
        if isinstance(v, str):
            try:
                return yaml.safe_load(v)
            except yaml.YAMLError:
                return v
        return v

    return {k: retype(v) if isinstance(v, (Mapping, list)) else v for k, v in overrides.items()}


def apply_overrides(config: dict, overrides: Mapping) -> dict:
    """Merge typed ``--config`` overrides into ``config`` in place; return the typed overrides."""
    typed = typed_overrides(overrides)
    config.update(deep_merge(config, typed))
    return typed


def check_yaml(path: str | Path) -> None:
    """Raise ConfigError naming file:line:column and the key there when ``path`` is not valid YAML."""
    text = Path(path).read_text()
    try:
        yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        if mark is None:
            raise ConfigError(f"{path}: not valid YAML: {exc}") from None
        problem = getattr(exc, "problem", None) or str(exc)
        ctx, cmark = getattr(exc, "context", None), getattr(exc, "context_mark", None)
        if ctx and cmark is not None and cmark.line != mark.line:
            # An unclosed bracket or quote is noticed lines later; the user's mistake is where it
            # opened.
            problem += f" ({ctx}; noticed at line {mark.line + 1})"
            mark = cmark
        line = text.splitlines()[mark.line] if mark.line < len(text.splitlines()) else ""
        key_match = re.match(r"\s*([^\s:#][^:#]*?)\s*:(\s|$)", line)
        key = key_match.group(1) if key_match else None
        where = f"{path}:{mark.line + 1}:{mark.column + 1}"
        raise ConfigError(f"{where}: not valid YAML" + (f" at key '{key}'" if key else "")
                          + f": {problem}") from None


def validate_section(stage: str, section: dict) -> dict:
    """Validate one stage's section (defaults filled in) against the stage's packaged schema.

    Stage scripts run by hand call this on the section they receive, so they get the same defaults
    and errors as a Snakemake run. A name the registry does not know has no schema: left as is.
    """
    if stage not in stages.STAGES:
        return section
    errors = sorted(_validator(stage).iter_errors(section), key=lambda e: list(map(str, e.path)))
    if errors:
        msgs = [f"key '{_fmt_path((stage, *e.absolute_path))}': {e.message}" for e in errors[:10]]
        raise ConfigError(f"invalid '{stage}' configuration:\n  " + "\n  ".join(msgs))
    return section


def validate_devices(devices: dict) -> dict:
    """The top-level `devices` section validated on its own (defaults filled in), for a stage
    script run by hand with a payload that no workflow validated."""
    try:
        return validate({"devices": devices})["devices"]
    except ConfigError as exc:
        raise ConfigError(str(exc).replace("<config>: ", "")) from None


def load(paths: Iterable[str | Path], schema_path: str | Path | None = None) -> dict:
    """Load and merge config files (later ones override earlier ones, recursively), then validate."""
    merged: dict = {}
    paths = [Path(p) for p in paths]
    for p in paths:
        check_yaml(p)
        data = _load_yaml(p) or {}
        if not isinstance(data, dict):
            raise ConfigError(f"{p}: the top level must be a mapping of stage sections")
        merged = deep_merge(merged, data)
    return validate(merged, schema_path, paths)


def deep_merge(a: Mapping, b: Mapping) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), Mapping) else v
    return out


# --- Typed views: each stage reads its validated section through a frozen dataclass -------------
# The schema states every key, type and default; a stage's `settings.py` states the same keys as
# fields, without defaults (a view is built from a validated section, which has every key), and
# `settings_drift` checks the two agree, so neither can gain a key the other lacks.

class TypedSection:
    """Base of a stage's frozen settings dataclass: built once from its validated section."""

    @classmethod
    def from_section(cls, section: Mapping):
        return typed(cls, section)

    def as_section(self) -> dict:
        """The plain section again (lists, dicts): what crosses to worker processes as JSON."""
        return _plain(self)


def typed(cls, section: Mapping):
    """``cls`` (a dataclass) from a validated ``section``: nested objects become their dataclasses
    and lists tuples. A key the schema leaves optional and without default reads None."""
    hints = typing.get_type_hints(cls)
    return cls(**{f.name: _convert(hints[f.name], section.get(f.name))
                  for f in dataclasses.fields(cls)})


def _arms(tp) -> tuple:
    return typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, types.UnionType) else (tp,)


def _convert(tp, value):
    if value is None:
        return None
    for arm in _arms(tp):
        if dataclasses.is_dataclass(arm) and isinstance(value, Mapping):
            return typed(arm, value)
        if typing.get_origin(arm) is tuple and isinstance(value, (list, tuple)):
            args = typing.get_args(arm)
            inner = args[0] if len(args) == 2 and args[1] is Ellipsis else None
            return tuple(_convert(inner or a, v) for v, a in zip(value, args if inner is None else
                                                                 [inner] * len(value)))
    return value


def _plain(value):
    if dataclasses.is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


_JSON_TYPES = {"integer": int, "number": float, "boolean": bool, "string": str, "null": type(None)}


def _schema_kinds(node: Mapping, defs: Mapping) -> set:
    """What values a schema node allows, as a set of Python types, ("tuple", kinds) for arrays and
    ("object", properties) for objects (only the $refs into common.schema.yaml's $defs)."""
    if "$ref" in node:
        node = {**defs[node["$ref"].rpartition("/")[2]], **{k: v for k, v in node.items()
                                                            if k != "$ref"}}
    if "oneOf" in node or "anyOf" in node:
        return set().union(*(_schema_kinds(n, defs) for n in node.get("oneOf", node.get("anyOf"))))
    if "const" in node:
        return {type(node["const"])}
    if "enum" in node:
        return {type(v) for v in node["enum"]}
    kinds: set = set()
    for t in ([node["type"]] if isinstance(node.get("type"), str) else node.get("type", [])):
        if t == "array":
            kinds.add(("tuple", frozenset(_schema_kinds(node.get("items", {}), defs))))
        elif t == "object":
            kinds.add(("object", id(node)))
        else:
            kinds.add(_JSON_TYPES[t])
    return kinds


def _annotation_kinds(tp) -> set:
    kinds: set = set()
    for arm in _arms(tp):
        if typing.get_origin(arm) is tuple:
            args = [a for a in typing.get_args(arm) if a is not Ellipsis]
            kinds.add(("tuple", frozenset().union(*(_annotation_kinds(a) for a in args))))
        elif dataclasses.is_dataclass(arm):
            kinds.add(("object", arm))
        else:
            kinds.add(arm)
    return kinds


def settings_drift(cls, sch: Mapping, defs: Mapping | None = None, where: str = "") -> list[str]:
    """How dataclass ``cls`` and object schema ``sch`` disagree: keys one has and the other lacks,
    and fields whose annotated types are not the types the schema allows (nested objects and
    arrays of objects checked the same way). Empty when they agree."""
    defs = schema("common")["$defs"] if defs is None else defs
    props = sch.get("properties", {})
    hints = typing.get_type_hints(cls)
    fields = [f.name for f in dataclasses.fields(cls)]
    out = [f"{where}{k}: in the schema, no field of {cls.__name__}" for k in props if k not in fields]
    out += [f"{where}{k}: a field of {cls.__name__}, not in the schema" for k in fields if k not in props]
    for k in (k for k in fields if k in props):
        want = _schema_kinds(props[k], defs)
        if "default" not in props[k] and k not in sch.get("required", ()):
            want.add(type(None))  # an optional key without default: None when it is left out
        out += _kinds_drift(want, _annotation_kinds(hints[k]),
                            _object_nodes(props[k], defs), defs, f"{where}{k}")
    return out


def _object_nodes(node: Mapping, defs: Mapping) -> dict:
    """{id: object schema} for the objects inside ``node`` (itself, array items, nested arrays)."""
    if "$ref" in node:
        node = defs[node["$ref"].rpartition("/")[2]]
    found = {}
    if node.get("type") == "object" or "object" in (node.get("type") or []):
        found[id(node)] = node
    for sub in [node.get("items")] + list(node.get("oneOf", [])):
        if isinstance(sub, Mapping):
            found.update(_object_nodes(sub, defs))
    return found


def _shape(kinds) -> frozenset:
    """``kinds`` with objects as plain "object" (their keys are compared field by field)."""
    return frozenset(("tuple", _shape(k[1])) if isinstance(k, tuple) and k[0] == "tuple" else
                     "object" if isinstance(k, tuple) else k for k in kinds)


def _kinds_drift(want: set, have: set, objects: dict, defs: Mapping, where: str) -> list[str]:
    if _shape(want) != _shape(have):
        return [f"{where}: the schema allows {_describe(want)}, the field is {_describe(have)}"]
    out = []
    for (_, node_id), (_, cls) in zip(_flat(want), _flat(have)):
        out += settings_drift(cls, objects[node_id], defs, where + ".")
    return out


def _flat(kinds) -> list:
    """The ("object", x) kinds inside ``kinds``, arrays looked into, in a stable order."""
    out = []
    for k in kinds:
        if isinstance(k, tuple) and k[0] == "tuple":
            out += _flat(k[1])
        elif isinstance(k, tuple):
            out.append(k)
    return out


def _describe(kinds) -> str:
    names = sorted("tuple of " + _describe(k[1]) if isinstance(k, tuple) and k[0] == "tuple" else
                   "object" if isinstance(k, tuple) else k.__name__ for k in kinds)
    return "(" + " | ".join(names) + ")"


# --- `gpulab config --explain`: every key with its type, default and description ---------------

def explain(section: str | None = None) -> list[str]:
    """Every key of the config (``section``: one stage or top-level section only): a line with its
    dotted path, type and default, then its description, indented; all read from the schemas."""
    top = schema("config")
    names = [section] if section else list(top["properties"])
    if section and section not in top["properties"]:
        raise ConfigError(f"no config section {section!r} (sections: {', '.join(top['properties'])})")
    lines: list[str] = []
    for name in names:
        node = top["properties"][name]
        if name in stages.STAGES or name == "fleet":
            node = {**schema(name), "default": node.get("default")}
        _explain(name, node, schema("common")["$defs"], lines)
    return lines


def _explain(path: str, node: Mapping, defs: Mapping, lines: list[str]) -> None:
    if "$ref" in node and node["$ref"].startswith("common.schema.yaml"):
        node = {**defs[node["$ref"].rpartition("/")[2]], **{k: v for k, v in node.items()
                                                            if k != "$ref"}}
    default = f"default {json.dumps(node['default'])}" if "default" in node else "no default"
    lines.append(f"{path}: {_type_text(node)}; {default}")
    lines += textwrap.wrap(" ".join(str(node.get("description", "(no description)")).split()),
                           100, initial_indent="    ", subsequent_indent="    ")
    for key, sub in (node.get("properties") or {}).items():
        _explain(f"{path}.{key}", sub, defs, lines)
    items = node.get("items")
    if isinstance(items, Mapping) and items.get("properties"):
        for key, sub in items["properties"].items():
            _explain(f"{path}[].{key}", sub, defs, lines)


def _type_text(node: Mapping) -> str:
    if "oneOf" in node:
        return " | ".join(_type_text(n) for n in node["oneOf"])
    if "const" in node:
        return json.dumps(node["const"])
    if "enum" in node:
        return "one of " + ", ".join(map(str, node["enum"]))
    if "$ref" in node:
        return "stage name"
    kinds = [node["type"]] if isinstance(node.get("type"), str) else node.get("type", [])
    return " | ".join(f"array of {_type_text(node.get('items', {}))}" if k == "array" else k
                      for k in kinds) or "any"
