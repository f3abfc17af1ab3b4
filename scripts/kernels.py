"""The seed's divide kernel (8-bit image / integer): CuPy RawKernels (naive, 8- and 16-byte vectors)
against the device's copy bandwidth, the image split over devices (per-device streams and threads,
pinned buffers, pipelining), and independent one-GPU jobs (variants job<N>, aggregated by 'jobs').
"""
from gpulab.kernels import extra_args, run
from gpulab.stage import stage_main

if __name__ == "__main__":
    raise SystemExit(stage_main("kernels", run, __doc__, extra_args=extra_args))
