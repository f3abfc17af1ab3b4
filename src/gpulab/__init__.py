"""gpulab: measure what a multi-GPU machine can really do, reproducibly."""

__version__ = "0.1.0"
