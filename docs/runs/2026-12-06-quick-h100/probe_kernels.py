"""The divide bench's rows with their host issue time, at the quick preset's sizes and larger.

    PYTHONPATH=src python docs/runs/2026-12-06-quick-h100/probe_kernels.py > probe_kernels.txt
"""
from __future__ import annotations

from gpulab import config, devices
from gpulab.kernels import bench
from gpulab.kernels.settings import Settings


def main():
    dev = devices.discover("cuda")[0]
    for batch, sizes in ((4194304, [1048576, 4194317]),
                         (268435456, [4194317, 16777216, 67108864, 268435456, 1073741824])):
        for trial in range(2):
            cfg = Settings.from_section(config.validate_section(
                "kernels", {"sizes_bytes": sizes, "batch_bytes": batch, "repeats": 5, "warmup": 2,
                             "variants": ["naive", "vec8", "vec16", "torch"]}))
            df = bench.run_divide(dev, cfg)
            for r in df.itertuples():
                print(f"batch {batch >> 20} MiB trial {trial} {r.variant:6s} {r.size_bytes:>11d} B "
                      f"calls {r.calls_per_sample:4d}: {r.gbps:8.1f} GB/s, gpu {1e6 * r.time_s_median:9.1f} "
                      f"us/call, host issue {1e6 * r.host_issue_s:7.1f} us/call, ratio "
                      f"{r.host_issue_s / r.time_s_median:.2f}{' LAUNCH-BOUND' if r.launch_bound else ''}",
                      flush=True)


if __name__ == "__main__":
    main()
