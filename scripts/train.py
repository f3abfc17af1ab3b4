"""Training sweeps: single device, DataParallel, DDP (bucket size, comm hooks, lr scaling),
naive model parallel, pipeline (GPipe, 1F1B) and tensor parallel; scaling, bubble and checks.

Variants (--variant): single, ddp, pipeline, tensor. --data is the data stage's digits.h5.
"""
from gpulab.stage import stage_main
from gpulab.train import run


def _args(ap):
    ap.add_argument("--data", default=None, help="digits training set (HDF5, from the data stage)")


if __name__ == "__main__":
    raise SystemExit(stage_main("train", run, __doc__, extra_args=_args))
