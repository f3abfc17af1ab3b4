"""Hardware probe: GPUs, peer access, topology and NVLink, CPU, NUMA, RAM, OS and software versions.

Writes the HDF5 result given by --out, plus <out>.json and <out>.md summaries beside it.
"""
from gpulab.probe import run
from gpulab.stage import stage_main

if __name__ == "__main__":
    raise SystemExit(stage_main("probe", run, __doc__))
