"""Transfer benchmarks: p2pBandwidthLatencyTest matrices (P2P disabled/enabled, copy engine and SM
copy), host <-> device (pinned/pageable, async/blocking, threads), hybrid split transfer, cudaMalloc
cost vs prior allocations, and host memcpy. GPU-only parts are recorded as not applicable on CPU.
"""
from gpulab.stage import stage_main
from gpulab.transfer import run

if __name__ == "__main__":
    raise SystemExit(stage_main("transfer", run, __doc__))
