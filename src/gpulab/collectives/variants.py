"""Variants of the stage: which path NCCL is made to take (each is one job, one launch).

NCCL reads its environment when a communicator is created, so each variant is a separate launch
with its own environment; gpulab.launch adds NCCL_NVLS_ENABLE=0 to every child on top of these.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from gpulab.collectives.formulas import OPS


@dataclass(frozen=True)
class Variant:
    name: str
    env: dict = field(default_factory=dict)
    ops: tuple = OPS  # library collectives this variant measures (intersected with the config's)
    handwritten: bool = False  # also run the hand-written algorithms
    gpu_only: bool = False  # an NCCL setting: not applicable to gloo on CPU
    note: str = ""


VARIANTS = {
    "default": Variant("default", handwritten=True,
                       note="the library chooses its algorithm and transport"),
    "ring": Variant("ring", {"NCCL_ALGO": "Ring"}, ops=tuple(o for o in OPS if o != "all_to_all"),
                    gpu_only=True, note="NCCL_ALGO=Ring (all-to-all is point-to-point: unaffected)"),
    "tree": Variant("tree", {"NCCL_ALGO": "Tree"}, ops=("all_reduce",), gpu_only=True,
                    note="NCCL_ALGO=Tree (NCCL implements Tree for all-reduce only)"),
    "no_p2p": Variant("no_p2p", {"NCCL_P2P_DISABLE": "1"}, gpu_only=True,
                      note="NCCL_P2P_DISABLE=1: GPU-to-GPU traffic goes through host memory"),
}


def get(name: str) -> Variant:
    """The variant of that name ('main', the stage scripts' default, means 'default')."""
    try:
        return VARIANTS["default" if name == "main" else name]
    except KeyError:
        raise ValueError(f"unknown collectives variant {name!r} "
                         f"(known: {', '.join(VARIANTS)})") from None
