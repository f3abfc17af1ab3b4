"""Offline installs for air-gapped GPU nodes.

``build`` makes a folder of wheels for a target Python version and platform: it resolves the
requirements here, turns every source-only package into a wheel, and fetches compiled packages again
for the target's Python and platform. ``install`` installs from that folder with no index.

    python -m gpulab.wheelhouse build --python-version 3.12 --dest wheelhouse snakemake==9.27.1
    python -m gpulab.wheelhouse install --src wheelhouse            # on the GPU node
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# What a GPU node usually lacks: the workflow engine and its plugins. torch/cupy/h5py come with the
# node's CUDA image and must not be replaced by CPU builds.
DEFAULT_REQUIREMENTS = ["snakemake==9.27.1"]
_WHEEL = re.compile(r"^(?P<name>.+?)-(?P<ver>[^-]+)(-\d[^-]*)?-(?P<py>[^-]+)-(?P<abi>[^-]+)-(?P<plat>[^-]+)\.whl$")


def _pip(*args: str) -> None:
    cmd = [sys.executable, "-m", "pip", *args]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def platforms_for(platform: str) -> list[str]:
    """A manylinux tag and every older manylinux tag pip should also accept for it."""
    m = re.fullmatch(r"manylinux_(\d+)_(\d+)_(\w+)", platform)
    if not m:
        return [platform]
    major, minor, arch = int(m.group(1)), int(m.group(2)), m.group(3)
    tags = [f"manylinux_{major}_{n}_{arch}" for n in range(minor, 4, -1)]
    return tags + [f"manylinux2014_{arch}", f"manylinux2010_{arch}", f"manylinux1_{arch}"]


def build(requirements: list[str], dest: Path, python_version: str, platform: str) -> list[Path]:
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "raw"
        _pip("download", "-q", "-d", str(raw), *requirements)
        for f in sorted(raw.iterdir()):
            m = _WHEEL.match(f.name)
            if f.suffix != ".whl":
                _pip("wheel", "-q", "--no-deps", "-w", str(dest), str(f))
            elif m and m.group("abi") == "none" and m.group("plat") == "any":
                shutil.copy2(f, dest / f.name)
            else:
                name, ver = m.group("name"), m.group("ver")
                plat_args = [a for p in platforms_for(platform) for a in ("--platform", p)]
                _pip("download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
                     python_version, "--implementation", "cp", *plat_args, "-d", str(dest),
                     f"{name}=={ver}")
    wheels = sorted(dest.glob("*.whl"))
    print(f"wheelhouse: {len(wheels)} wheels in {dest} for Python {python_version} / {platform}")
    return wheels


def install(src: Path, requirements: list[str], target: Path | None = None) -> None:
    args = ["install", "-q", "--no-index", "--find-links", str(src)]
    if target:
        args += ["--target", str(target)]
    _pip(*args, *requirements)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gpulab.wheelhouse", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="download/build wheels for an offline node")
    b.add_argument("--python-version", default="3.12", help="target Python, e.g. 3.12")
    b.add_argument("--platform", default="manylinux_2_28_x86_64", help="target platform tag")
    b.add_argument("--dest", type=Path, default=Path("wheelhouse"))
    b.add_argument("requirements", nargs="*", default=DEFAULT_REQUIREMENTS)
    i = sub.add_parser("install", help="install from a wheel folder with no network")
    i.add_argument("--src", type=Path, default=Path("wheelhouse"))
    i.add_argument("--target", type=Path, default=None, help="pip --target folder (no venv)")
    i.add_argument("requirements", nargs="*", default=DEFAULT_REQUIREMENTS)
    args = ap.parse_args(argv)
    if args.cmd == "build":
        build(args.requirements, args.dest, args.python_version, args.platform)
    else:
        install(args.src, args.requirements, args.target)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
