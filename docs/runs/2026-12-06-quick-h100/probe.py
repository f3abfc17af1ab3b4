"""The sort harness check at several key counts, and the divide kernels' host issue time, on a GPU.

    PYTHONPATH=src python docs/runs/2026-12-06-quick-h100/probe.py > probe.txt

For each size: the check as shipped (ABBA blocks, median ratio) with its floor lifted to that size,
and the host time to issue one call of each side (perf_counter around a batch, no sync).
"""
from __future__ import annotations

import time

import numpy as np

from gpulab import config
from gpulab.sort import bench, p2p
from gpulab.sort.settings import Settings


def issue_us(fn, calls=50):
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return 1e6 * (time.perf_counter() - t0) / calls


def main():
    for n in (1 << 20, 1 << 22, 1 << 24, 1 << 26):
        cfg = Settings.from_section(config.validate_section(
            "sort", {"bar_keys": n, "device_counts": [1], "algorithms": ["p2p"], "warmup": 2,
                     "repeats": 3}))
        bench.HARNESS_MIN_KEYS = n
        for trial in range(2):
            b = bench.Bench(cfg, "cuda", 1, "gpu")
            chk = b.harness_check(seed=trial)
            rows = {r["algorithm"]: r for r in b.rows}
            cp = b.single.cp
            xd = b.single.to_device(0, np.random.default_rng(0).integers(0, 2**32, n, dtype=np.uint32))
            path = p2p.P2PMerge(b.single, bench.NullTimer())
            cp.cuda.Device(0).synchronize()
            raw_issue = issue_us(lambda: cp.sort(xd))
            cp.cuda.Device(0).synchronize()
            path_issue = issue_us(lambda: path.sort([xd]))
            cp.cuda.Device(0).synchronize()
            print(f"n=2^{n.bit_length() - 1} trial {trial}: {chk.verdict} overhead "
                  f"{100 * chk.value:+.2f} %  gpu per call: path "
                  f"{1e6 * rows['p2p']['time_s_median']:.1f} us, raw "
                  f"{1e6 * rows['cupy.sort']['time_s_median']:.1f} us; host issue per call: "
                  f"path {path_issue:.1f} us, raw {raw_issue:.1f} us", flush=True)
            b.close()


if __name__ == "__main__":
    main()
