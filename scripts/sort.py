"""Multi-device sorting: numpy / torch / cupy baselines, P2P merge sort, HET sort and radix-partition
sort over 1..N devices (CUDA GPUs, or CPU virtual devices), timed per phase and verified.

Writes the HDF5 result given by --out (tables runs, phases, merge_steps, radix_balance, skipped,
failures, logic_check, bars).
"""
from gpulab.sort import run
from gpulab.stage import stage_main

if __name__ == "__main__":
    raise SystemExit(stage_main("sort", run, __doc__))
