"""Code inputs by static analysis: the files of ``gpulab`` a job's code is made of.

A job's code is its script and every ``gpulab`` module it imports (``ast``, lazy imports inside
functions included), plus the package data files those modules read (``limits.yaml``, schemas,
reference tables). gpulab.workflow makes them the code inputs of each rule, so editing any of them
reruns exactly the jobs whose code reaches it. Nothing is imported: files are parsed, once each.
"""
from __future__ import annotations

import ast
import contextlib
import functools
import hashlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from gpulab import stages as registry

PACKAGE = "gpulab"
# Files of the package that are not code a job reads.
_NOT_DATA = {"README.md"}


def _resolved(path: Path) -> Path:
    # Parsing the workflow asks for the same few hundred paths tens of thousands of times; each
    # resolve() is a chain of stat calls (2 of the 5 s a dry run took). A relative path depends on
    # the working directory, so only absolute ones are remembered.
    return _resolved_absolute(path) if path.is_absolute() else path.resolve()


@functools.lru_cache(maxsize=None)
def _resolved_absolute(path: Path) -> Path:
    return path.resolve()


def module_file(module: str, src: Path) -> Path | None:
    """The source file of ``module`` (dotted, under ``src``): ``a/b.py`` or ``a/b/__init__.py``."""
    return _module_file(module, _resolved(Path(src)))


@functools.lru_cache(maxsize=None)
def _module_file(module: str, src: Path) -> Path | None:
    base = Path(src, *module.split("."))
    for f in (base.with_suffix(".py"), base / "__init__.py"):
        if f.is_file():
            return f
    return None


def module_name(path: Path, src: Path) -> str:
    rel = _resolved(Path(path)).relative_to(_resolved(Path(src))).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _parents(module: str) -> list[str]:
    """``gpulab.a.b`` -> [``gpulab``, ``gpulab.a``]: importing a module runs its packages first."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


@dataclass(frozen=True)
class _Facts:
    """What one file's syntax tree says: the ``gpulab`` modules it imports and the string constants
    of its code (docstrings left out: they cite files rather than read them), everywhere and at
    module level alone (outside function bodies: what importing the module runs)."""

    imports: frozenset
    top_imports: frozenset
    strings: frozenset
    top_strings: frozenset


def _facts_of(path: Path, src: Path) -> _Facts:
    path = _resolved(Path(path))
    return _facts(path, _resolved(Path(src)), path.stat().st_mtime_ns)


@functools.lru_cache(maxsize=None)
def _facts(path: Path, src: Path, mtime_ns: int) -> _Facts:
    module = module_name(path, src) if _under(path, src) else ""
    raw = _syntax_facts(path, module, path.name == "__init__.py")

    def imported(entries) -> set[str]:
        names: set[str] = set()
        for entry in entries:
            if isinstance(entry, str):  # import a.b
                names.add(entry)
                continue
            # `from pkg import mod` runs pkg as a parent package only; `from pkg import name`
            # (a function, a class, or *) uses pkg itself. Which names are modules is a fact of the
            # tree, not of this file, so it is decided here, after the (cached) parse.
            pkg, imported_names = entry
            subs = [f"{pkg}.{a}" for a in imported_names if a != "*"]
            mods = [m for m in subs if module_file(m, src) is not None]
            names.update(mods + ([pkg] if len(mods) < len(imported_names) else []))
        return names

    def ours(names):
        return frozenset(n for n in names if (n == PACKAGE or n.startswith(PACKAGE + "."))
                         and module_file(n, src) is not None)

    return _Facts(ours(imported(raw["imports"])), ours(imported(raw["top_imports"])),
                  frozenset(raw["strings"]), frozenset(raw["top_strings"]))


# Parsing every module of the package is most of the time a Snakemake start spends on the workflow
# (1.5 of 3 s for a dry run on 2 cores), and the suite and a user's edit-run loop start it hundreds
# of times over the same files. A file's syntax facts depend only on its bytes, its module name and
# the parser, so they are kept on disk under that content key: any edit is a new key, a copied
# workflow (the tests') finds the same keys, and a damaged or unwritable cache only means parsing.
_CACHE_FORMAT = 1


def facts_cache_dir() -> Path | None:
    """Where syntax facts are kept: $GPULAB_CACHE_DIR/code-facts, else the user's cache folder
    ($XDG_CACHE_HOME or ~/.cache)/gpulab/code-facts; GPULAB_CACHE_DIR=off keeps none."""
    base = os.environ.get("GPULAB_CACHE_DIR")
    if base == "off":
        return None
    if not base:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
        if not os.path.isabs(xdg):  # no home directory (a bare batch account): keep none
            return None
        base = str(Path(xdg) / "gpulab")
    return Path(base) / "code-facts"


def _syntax_facts(path: Path, module: str, is_package: bool) -> dict:
    data = path.read_bytes()
    key = hashlib.sha256(repr((_CACHE_FORMAT, sys.version_info[:2], module, is_package)).encode()
                         + b"\0" + data).hexdigest()
    cache = facts_cache_dir()
    entry = cache / key[:2] / f"{key}.json" if cache else None
    if entry is not None:
        try:
            return _checked(json.loads(entry.read_text()))
        except (OSError, ValueError):
            pass  # not there yet, or damaged: parse
    raw = _parse_facts(data, str(path), module, is_package)
    if entry is not None:
        tmp = entry.with_name(f".{entry.name}.{os.getpid()}.tmp")
        try:
            entry.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(raw))
            os.replace(tmp, entry)  # atomic: a reader sees the whole entry or none
        except OSError:  # a read-only or full cache folder costs a parse, never the run
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
    return raw


def _checked(raw) -> dict:
    """A cache entry's facts in the shape a parse gives, or ValueError for anything else."""
    def entry(e):
        if isinstance(e, str):
            return e
        if isinstance(e, list) and len(e) == 2 and isinstance(e[0], str) \
                and isinstance(e[1], list) and all(isinstance(n, str) for n in e[1]):
            return (e[0], e[1])
        raise ValueError(f"not an import: {e!r}")

    if not isinstance(raw, dict) or set(raw) != {"imports", "top_imports", "strings", "top_strings"} \
            or not all(isinstance(v, list) for v in raw.values()):
        raise ValueError("not a syntax-facts entry")
    if not all(isinstance(x, str) for k in ("strings", "top_strings") for x in raw[k]):
        raise ValueError("not a string constant")
    return {"imports": [entry(e) for e in raw["imports"]],
            "top_imports": [entry(e) for e in raw["top_imports"]],
            "strings": raw["strings"], "top_strings": raw["top_strings"]}


def _parse_facts(data: bytes, filename: str, module: str, is_package: bool) -> dict:
    """One walk of the file's syntax tree: what it imports (``import a`` as ``"a"``, ``from p import
    x, y`` as ``["p", ["x", "y"]]``) and its string constants, everywhere and at module level alone."""
    tree = ast.parse(data, filename=filename)
    found: dict[str, list] = {"all": [], "top": []}
    strings: dict[str, set] = {"all": set(), "top": set()}

    def visit(node, top: bool):
        body = getattr(node, "body", None)
        skip = None
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(
                    node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            skip = body[0].value  # the docstring
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            top = False
        entries: list = []
        if isinstance(node, ast.Import):
            entries = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            entries = [(_absolute(node, module, is_package), [a.name for a in node.names])]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            strings["all"].add(node.value)
            if top:
                strings["top"].add(node.value)
        found["all"] += entries
        if top:
            found["top"] += entries
        for child in ast.iter_child_nodes(node):
            if child is not skip:
                visit(child, top)

    visit(tree, True)
    return {"imports": found["all"], "top_imports": found["top"],
            "strings": sorted(strings["all"]), "top_strings": sorted(strings["top"])}


def imports_of(path: Path, src: Path, top_only: bool = False) -> set[str]:
    """The ``gpulab`` modules that the file at ``path`` imports, anywhere in it (a lazy import
    inside a function is still code the job may run), or with ``top_only`` at module level only.
    ``from pkg import name`` counts ``pkg.name`` where that is a module, else ``pkg``."""
    f = _facts_of(path, src)
    return set(f.top_imports if top_only else f.imports)


def _under(path: Path, root: Path) -> bool:
    try:
        _resolved(Path(path)).relative_to(_resolved(Path(root)))
        return True
    except ValueError:
        return False


def _strings(path: Path, src: Path, top_only: bool = False) -> frozenset:
    f = _facts_of(path, src)
    return f.top_strings if top_only else f.strings


@functools.lru_cache(maxsize=None)
def _package_data(src: Path) -> tuple[Path, ...]:
    root = Path(src, PACKAGE)
    return tuple(sorted(_resolved(p) for p in root.rglob("*") if p.is_file()
                        and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts
                        and p.name not in _NOT_DATA))


def package_data(src: Path) -> list[Path]:
    """Every data file shipped inside the package (not Python, not caches, not READMEs)."""
    return list(_package_data(_resolved(Path(src))))


def _stage_dir(path: Path, src: Path) -> str | None:
    """The stage package a file lies in (its first folder under gpulab/ when that is a stage)."""
    parts = _resolved(Path(path)).relative_to(_resolved(Path(src, PACKAGE))).parts
    return parts[0] if len(parts) > 1 and parts[0] in registry.STAGES else None


def data_read_by(path: Path, src: Path, data: Iterable[Path], top_only: bool = False) -> set[Path]:
    """The package data files a module names in its code: a string constant that is the file's name,
    a path ending in it, or a suffix its name ends with (``.schema.yaml``; a bare extension such as
    ``.yaml`` names no file), for a file in the module's folder or below. Another stage's files are
    that stage's own: a registry module that builds ``<stage>/schema.yaml`` from a stage name does
    not make every stage read every schema."""
    path, src = _resolved(Path(path)), _resolved(Path(src))
    here, own_stage = path.parent, _stage_dir(path, src)
    strings = [s for s in _strings(path, src, top_only) if "." in s and 4 <= len(s) <= 200 and "\n" not in s]
    out = set()
    for f in data:
        f = _resolved(Path(f))
        if not f.is_relative_to(here) or _stage_dir(f, src) not in (None, own_stage):
            continue
        if any(s == f.name or s.endswith("/" + f.name)
               or (s.startswith(".") and s.count(".") > 1 and f.name.endswith(s)) for s in strings):
            out.add(f)
    return out


@functools.lru_cache(maxsize=None)
def _package_data_read_by(path: Path, src: Path, mtime_ns: int, top_only: bool) -> frozenset:
    return frozenset(data_read_by(path, src, _package_data(src), top_only))


def code_closure(roots: Iterable[Path], src: Path) -> list[Path]:
    """``roots`` (files) and every ``gpulab`` module and package data file they reach.

    A module imported by name counts whole (its functions' lazy imports too: which of them a job
    calls is not known statically). A package run only because a module inside it is imported
    (``gpulab.data`` for ``gpulab.data.api``) counts by its module-level code alone: its functions
    run only when called through it, and then it is imported by name. So the training stage, which
    imports ``gpulab.data.api``, does not depend on the data benchmark that ``gpulab.data.run``
    imports lazily."""
    src = _resolved(Path(src))
    mode: dict[Path, bool] = {}  # file -> followed whole (True) or module level only (False)
    todo = [(_resolved(Path(r)), True) for r in roots]
    while todo:
        f, whole = todo.pop()
        if f in mode and (mode[f] or not whole):
            continue
        mode[f] = whole
        if f.suffix != ".py" or not _under(f, src):
            if f.suffix == ".py":  # a script outside the package: its imports, whole
                todo += [(mf, True) for n in imports_of(f, src) if (mf := module_file(n, src))]
                todo += [(mf, False) for n in imports_of(f, src) for p in _parents(n)
                         if (mf := module_file(p, src))]
            continue
        names = imports_of(f, src, top_only=not whole)
        for n in names:
            if (mf := module_file(n, src)) is not None:
                todo.append((_resolved(mf), True))
        for n in [*names, module_name(f, src)]:
            todo += [(_resolved(mf), False) for p in _parents(n) if (mf := module_file(p, src))]
    files = set(mode)
    for f, whole in mode.items():
        if f.suffix == ".py" and _under(f, src):
            files |= _package_data_read_by(f, src, f.stat().st_mtime_ns, not whole)
    return sorted(files)
