"""One archive per run: report, export, config actually used, baselines and result files, with a
manifest (sha256 per file, commit, host) that ``gpulab bundle --verify`` checks.

Left out: the data stage's generated datasets (``results/data/<host>/files``, hundreds of MB that a
rerun makes again) and every other HDF5 file that is not a gpulab result (training sets), logs and
temporary files. The config actually used is the payload each job read (``results/payloads``), the
config recorded in each result, and the top-level config file.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

from gpulab import export, results

MANIFEST = "MANIFEST.json"
BUNDLE_VERSION = 1


class BundleError(ValueError):
    """A bundle that cannot be made or does not verify (the message names the file)."""


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _members(results_dir: Path, config_files: list[Path], baselines_dir: Path | None,
             report_dir: Path | None, tmp_export: Path) -> dict[str, bytes]:
    """Archive name -> content of everything the bundle holds (manifest not included)."""
    out: dict[str, bytes] = {}
    files = results.find_results(results_dir)
    kept = list(results.with_attrs(files, "bundle"))  # gpulab results only: no datasets
    for f, _ in kept:
        out[f"results/{f.relative_to(results_dir).as_posix()}"] = f.read_bytes()
    for extra in sorted(results_dir.glob("probe/*.json")) + sorted(results_dir.glob("probe/*.md")):
        out[f"results/{extra.relative_to(results_dir).as_posix()}"] = extra.read_bytes()
    for p in sorted((results_dir / "payloads").glob("*.json")):
        out[f"config/payloads/{p.name}"] = p.read_bytes()
    used = {str(a["stage"]) + "/" + str(a.get("host")) + "/" + str(a.get("variant")):
            a.get("config") for _, a in kept}
    out["config/from_results.json"] = json.dumps(used, indent=1, sort_keys=True,
                                                 default=str).encode()
    for c in config_files:
        if c.is_file():
            out[f"config/{c.name}"] = c.read_bytes()
    if baselines_dir and baselines_dir.is_dir():
        for b in sorted(baselines_dir.glob("*.yaml")):
            out[f"baselines/{b.name}"] = b.read_bytes()
    if report_dir and report_dir.is_dir():
        for r in sorted(p for p in report_dir.rglob("*") if p.is_file() and
                        not p.name.startswith(".")):
            out[f"report/{r.relative_to(report_dir).as_posix()}"] = r.read_bytes()
    for p in export.write(export.tidy([f for f, _ in kept]), tmp_export / "results"):
        out[f"export/{p.name}"] = p.read_bytes()
    return out


def create(out: str | os.PathLike, results_dir: str | os.PathLike = "results",
           config_files: list[str | os.PathLike] = ("config.yaml",),
           baselines_dir: str | os.PathLike | None = "baselines",
           report_dir: str | os.PathLike | None = None) -> Path:
    """Write the bundle ``out`` (.tar.gz) atomically; returns its path."""
    import tempfile

    results_dir, out = Path(results_dir), Path(out)
    if not results_dir.is_dir():
        raise BundleError(f"{results_dir}: no results folder to bundle")
    report_dir = Path(report_dir) if report_dir else results_dir / "report"
    with tempfile.TemporaryDirectory(prefix="gpulab-bundle-") as tmp:
        members = _members(results_dir, [Path(c) for c in config_files],
                           Path(baselines_dir) if baselines_dir else None, report_dir, Path(tmp))
    commit, dirty = results.git_state()
    manifest = {"bundle_version": BUNDLE_VERSION, "created_at": results.now_iso(),
                "commit": commit, "git_dirty": dirty, "host": results.host_name(),
                "files": {name: {"sha256": sha256(data), "bytes": len(data)}
                          for name, data in sorted(members.items())}}
    members[MANIFEST] = json.dumps(manifest, indent=1, sort_keys=True).encode()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp_out = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        with tarfile.open(tmp_out, "w:gz") as tar:
            for name, data in sorted(members.items()):
                info = tarfile.TarInfo(name)
                info.size, info.mode = len(data), 0o644
                tar.addfile(info, io.BytesIO(data))
        os.replace(tmp_out, out)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_out)
    return out


def verify(path: str | os.PathLike) -> list[str]:
    """Problems of the bundle at ``path`` (empty: it verifies): every file the manifest lists is
    there with its sha256 and size, and no file is there that the manifest does not list."""
    path = Path(path)
    try:
        with tarfile.open(path, "r:gz") as tar:
            contents = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
    except (OSError, tarfile.TarError, EOFError) as exc:
        return [f"{path}: not a readable .tar.gz: {exc}"]
    if MANIFEST not in contents:
        return [f"{path}: no {MANIFEST}"]
    try:
        listed = json.loads(contents.pop(MANIFEST))["files"]
    except (ValueError, KeyError, TypeError) as exc:
        return [f"{path}: {MANIFEST} unreadable: {exc}"]
    problems = []
    for name, meta in sorted(listed.items()):
        if name not in contents:
            problems.append(f"{name}: listed in the manifest, missing from the bundle")
        elif sha256(contents[name]) != meta.get("sha256") or len(contents[name]) != meta.get("bytes"):
            problems.append(f"{name}: sha256 {sha256(contents[name])[:12]}... differs from the "
                            f"manifest's {str(meta.get('sha256'))[:12]}...")
    problems += [f"{name}: in the bundle, not in the manifest" for name in sorted(set(contents) -
                                                                                    set(listed))]
    return problems


def manifest(path: str | os.PathLike) -> dict:
    with tarfile.open(path, "r:gz") as tar:
        return json.loads(tar.extractfile(MANIFEST).read())
