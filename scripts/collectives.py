"""Collectives: library all-reduce / all-gather / reduce-scatter / broadcast / all-to-all over a
size sweep (algbw and busbw as nccl-tests defines them), NCCL path variants, and hand-written ring,
tree and parameter-server all-reduce over send/recv; every result is checked exactly.

One torchrun process per device (NCCL on GPUs, gloo on CPU virtual devices). --variant picks the
path: default, ring (NCCL_ALGO=Ring), tree (NCCL_ALGO=Tree), no_p2p (NCCL_P2P_DISABLE=1).
"""
from gpulab.collectives import run
from gpulab.stage import stage_main

if __name__ == "__main__":
    raise SystemExit(stage_main("collectives", run, __doc__))
