"""The seed's divide kernel: every pixel of an 8-bit image divided by an integer.

CUDA: three CuPy RawKernels, the seed's naive one (one byte per thread), its ``char_vec`` variant (8
bytes through one ``int2`` load/store per thread) and a 16-byte one (``int4``). The vector kernels
handle a length that is not a multiple of the vector width with a tail: the first ``n % width``
threads of the grid also divide one trailing byte each. CPU: numpy's and torch's floor division on
the same uint8 data. ``torch`` (``torch.floor_divide``) runs on both, as a library reference.

Every variant is checked byte for byte against :func:`reference` (numpy).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

RAW_VARIANTS = ("naive", "vec8", "vec16")  # CuPy RawKernels: CUDA only
CPU_VARIANTS = ("numpy",)  # host-only implementations
LIB_VARIANTS = ("torch",)  # torch.floor_divide: CPU and CUDA
WIDTH = {"naive": 1, "vec8": 8, "vec16": 16}

KERNEL_SOURCE = r"""
// The seed's char_vec: 8 pixels moved by one 8-byte (int2) load and one store. __align__ makes
// the reinterpret_cast of the local array legal (the seed relied on the register allocator).
struct __align__(8) char_vec8 {
    static constexpr int size = 8;
    unsigned char data[size];
    __device__ char_vec8(const unsigned char* __restrict__ p) {
        *reinterpret_cast<int2*>(data) = *reinterpret_cast<const int2*>(p);
    }
    __device__ void store(unsigned char* p) const {
        *reinterpret_cast<int2*>(p) = *reinterpret_cast<const int2*>(data);
    }
};

// The same with 16 bytes (int4): one 128-bit load/store per thread.
struct __align__(16) char_vec16 {
    static constexpr int size = 16;
    unsigned char data[size];
    __device__ char_vec16(const unsigned char* __restrict__ p) {
        *reinterpret_cast<int4*>(data) = *reinterpret_cast<const int4*>(p);
    }
    __device__ void store(unsigned char* p) const {
        *reinterpret_cast<int4*>(p) = *reinterpret_cast<const int4*>(data);
    }
};

extern "C" __global__ void divide_naive(const unsigned char* __restrict__ in,
                                        unsigned char* __restrict__ out,
                                        const unsigned long long n, const int div) {
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i] / div;
}

template <typename Vec>
__device__ __forceinline__ void divide_vec(const unsigned char* __restrict__ in,
                                           unsigned char* __restrict__ out,
                                           const unsigned long long n, const int div) {
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    const unsigned long long nvec = n / Vec::size;
    // One integer division per thread, then an exact multiply-shift per byte: x / d ==
    // (x * ceil(2^16 / d)) >> 16 for every x, d in [0, 255] x [1, 255] (the error term
    // x * e / 2^16 < 255 / 2^16 stays below 1 / d). A run-time '/' per byte made the vector
    // kernels arithmetic-bound on an H200 (67% of copy bandwidth, measured 2026-12-02).
    const unsigned int magic = (65536u + (unsigned int)div - 1u) / (unsigned int)div;
    if (i < nvec) {
        Vec v(in + i * Vec::size);
#pragma unroll
        for (int k = 0; k < Vec::size; ++k)
            v.data[k] = (unsigned char)(((unsigned int)v.data[k] * magic) >> 16);
        v.store(out + i * Vec::size);
    }
    // Tail: the n % size trailing bytes, one per thread, taken by the first threads of the grid.
    const unsigned long long done = nvec * Vec::size;
    if (i < n - done) out[done + i] = in[done + i] / div;
}

extern "C" __global__ void divide_vec8(const unsigned char* __restrict__ in,
                                       unsigned char* __restrict__ out,
                                       const unsigned long long n, const int div) {
    divide_vec<char_vec8>(in, out, n, div);
}

extern "C" __global__ void divide_vec16(const unsigned char* __restrict__ in,
                                        unsigned char* __restrict__ out,
                                        const unsigned long long n, const int div) {
    divide_vec<char_vec16>(in, out, n, div);
}
"""

MAX_GRID_X = 2**31 - 1


@dataclass(frozen=True)
class Geometry:
    """Launch shape of one kernel call over ``n`` bytes."""

    n: int
    width: int  # bytes per thread in the main part
    nvec: int  # full vectors
    tail: int  # trailing bytes, one per thread
    threads: int  # threads that have work
    block: int
    blocks: int


def geometry(n: int, width: int, block: int) -> Geometry:
    """Grid for ``n`` bytes at ``width`` bytes per thread (width 1 = naive), tail included."""
    if n < 1:
        raise ValueError(f"image size must be >= 1 byte, got {n}")
    if width not in (1, 8, 16):
        raise ValueError(f"vector width must be 1, 8 or 16 bytes, got {width}")
    if not 32 <= block <= 1024 or block % 32:
        raise ValueError(f"threads per block must be a multiple of 32 in [32, 1024], got {block}")
    nvec, tail = divmod(n, width)
    threads = max(nvec, tail)
    blocks = math.ceil(threads / block)
    if blocks > MAX_GRID_X:
        raise ValueError(f"{n} bytes need {blocks} blocks of {block}: more than CUDA's grid limit")
    return Geometry(n, width, nvec, tail, threads, block, blocks)


def check_divisor(div: int) -> int:
    if isinstance(div, bool) or not isinstance(div, (int, np.integer)) or not 1 <= div <= 255:
        raise ValueError(f"kernels.divisor must be an integer in [1, 255], got {div!r}")
    return int(div)


def make_image(n: int, seed: int = 0) -> np.ndarray:
    """A random 8-bit 'image' of ``n`` pixels (flat; the kernel does not care about the shape)."""
    return np.random.default_rng(seed).integers(0, 256, size=n, dtype=np.uint8)


def reference(img: np.ndarray, div: int) -> np.ndarray:
    """What every variant must produce: C's ``unsigned char / int`` (truncation = floor here)."""
    return np.floor_divide(img, np.uint8(check_divisor(div)))


def variants_for(kind: str, wanted: list[str]) -> tuple[list[str], list[str]]:
    """(variants that run on this device kind, variants that do not apply) in config order."""
    runnable = set(LIB_VARIANTS) | (set(RAW_VARIANTS) if kind == "cuda" else set(CPU_VARIANTS))
    unknown = [v for v in wanted if v not in RAW_VARIANTS + CPU_VARIANTS + LIB_VARIANTS]
    if unknown:
        raise ValueError(f"kernels.variants: unknown variant(s) {unknown}; "
                         f"known: {list(RAW_VARIANTS + CPU_VARIANTS + LIB_VARIANTS)}")
    return [v for v in wanted if v in runnable], [v for v in wanted if v not in runnable]


def kernel_for(kind: str, configured: str) -> str:
    """The implementation the split and the jobs use: the configured one on CUDA, numpy on CPU
    (numpy's division is vectorised and releases the GIL; torch's uint8 division on CPU is not)."""
    return configured if kind == "cuda" else "numpy"


def one_thread_per_cpu_device(kind: str) -> None:
    """On CPU virtual devices each device is one host thread: keep torch's copies single-threaded
    like numpy's division, so threads of different devices do not fight over the cores."""
    if kind == "cpu":
        import torch

        torch.set_num_threads(1)


def _cupy():
    try:
        import cupy
    except ImportError as exc:  # a GPU host without CuPy cannot run the RawKernels
        raise RuntimeError("the divide RawKernels need CuPy on a CUDA host: "
                           "pip install 'gpulab[cuda13]' (or [cuda] for CUDA 12)") from exc
    return cupy


_KERNELS: dict = {}


def _raw_kernel(variant: str):
    # RawKernel (not RawModule) because it loads its function once per device by itself. The
    # source is plain C++11, NVRTC's defaults compile it.
    if variant not in _KERNELS:
        _KERNELS[variant] = _cupy().RawKernel(KERNEL_SOURCE, f"divide_{variant}")
    return _KERNELS[variant]


def divider(variant: str, out, inp, div: int, block: int = 256) -> Callable[[], None]:
    """A zero-argument call computing ``out = inp // div`` with ``variant``, prepared up front.

    ``out``/``inp``: torch uint8 tensors of equal length on one device (CPU or CUDA), or numpy
    arrays for ``numpy``. Everything that costs host time (CuPy views, grid, argument packing) is
    done here, so a timed call is only the launch. CUDA calls run on torch's current stream.
    """
    div = check_divisor(div)
    n = int(inp.numel() if hasattr(inp, "numel") else inp.size)
    if n != int(out.numel() if hasattr(out, "numel") else out.size):
        raise ValueError("divide: input and output lengths differ")
    if variant == "numpy":
        a, b, d = np.asarray(inp), np.asarray(out), np.uint8(div)
        return lambda: np.floor_divide(a, d, out=b)
    if variant == "torch":
        import torch

        return lambda: torch.floor_divide(inp, div, out=out)
    if variant not in RAW_VARIANTS:
        raise ValueError(f"unknown divide variant {variant!r}")
    if inp.device.type != "cuda":
        raise ValueError(f"variant {variant!r} is a CUDA RawKernel; it cannot run on {inp.device}")
    return _raw_divider(variant, out, inp, n, div, block)


def _raw_divider(variant, out, inp, n, div, block):
    import torch

    cp = _cupy()
    g = geometry(n, WIDTH[variant], block)
    for t in (inp, out):
        if t.data_ptr() % g.width:
            raise ValueError(f"{variant} needs {g.width}-byte aligned buffers "
                             f"(address {t.data_ptr():#x})")
    dev = inp.device.index
    with torch.cuda.device(dev), cp.cuda.Device(dev):
        kern = _raw_kernel(variant)
        a, b = cp.from_dlpack(inp), cp.from_dlpack(out)  # zero-copy views of torch's memory
    args = (a, b, np.uint64(n), np.int32(div))
    streams: dict[int, object] = {}

    def call():
        # Launch on torch's current stream so torch's CUDA events and stream ordering cover it.
        ptr = torch.cuda.current_stream(dev).cuda_stream
        s = streams.get(ptr)
        if s is None:  # 0 is the legacy default stream, which CuPy calls Stream.null
            s = streams[ptr] = cp.cuda.Stream.null if ptr == 0 else cp.cuda.ExternalStream(ptr, dev)
        with cp.cuda.Device(dev), s:
            kern((g.blocks,), (g.block,), args)

    return call
