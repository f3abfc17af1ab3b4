"""Thin CuPy runtime-API layer for the GPU transfer measurements (CuPy is imported lazily).

Everything here works on raw device pointers from ``cudaMalloc`` and raw runtime calls, never on
CuPy arrays: a CuPy kernel that receives another GPU's array enables peer access on its own
(``_check_peer_access``), which would contaminate the P2P=Disabled measurements. Kernels get their
pointers as plain 64-bit integers, so CuPy cannot know which device they live on.
"""
from __future__ import annotations

import ctypes
from contextlib import contextmanager

import numpy as np

# cudaMemcpyKind, cudaHostAlloc flags and error codes (stable CUDA ABI values).
H2D, D2H, D2D = 1, 2, 3
HOST_ALLOC_PORTABLE, HOST_ALLOC_MAPPED = 1, 2
ERR_PEER_ALREADY_ENABLED, ERR_PEER_NOT_ENABLED = 704, 705

KERNELS = r"""
// Holds the stream until the host has queued every copy of a sample (or a timeout passes), so
// the events time the copies, not the host issuing them (p2pBandwidthLatencyTest's delay kernel).
// flag[1] = 1 records a timeout: the copies then started before the host finished queueing them
// (a stream holds only so many queued operations), and the sample is invalid.
extern "C" __global__ void spin(volatile int* flag, unsigned long long timeout_clocks) {
    long long start = clock64();
    while (!flag[0]) {
        if ((unsigned long long)(clock64() - start) > timeout_clocks) {
            flag[1] = 1;
            __threadfence_system();
            break;
        }
    }
}
// SM copy: a grid-stride loop of 16-byte loads/stores; dst may be a peer GPU's memory.
extern "C" __global__ void copy_int4(int4* __restrict__ dst, const int4* __restrict__ src,
                                     unsigned long long n) {
    unsigned long long stride = (unsigned long long)blockDim.x * gridDim.x;
    for (unsigned long long k = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; k < n;
         k += stride) {
        dst[k] = src[k];
    }
}
"""


def cupy():
    try:
        import cupy as cp
    except ImportError as exc:  # pragma: no cover - GPU hosts only
        raise RuntimeError("the transfer stage's GPU path needs CuPy "
                           "(pip install 'gpulab[cuda13]' or 'gpulab[cuda]')") from exc
    return cp


def rt():
    return cupy().cuda.runtime


@contextmanager
def on(device: int):
    with cupy().cuda.Device(device):
        yield


def host_view(ptr: int, n: int) -> np.ndarray:
    """A numpy view of ``n`` bytes of host memory at ``ptr`` (pinned allocations)."""
    return np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(ptr))


class PinnedHost:
    """cudaHostAlloc'd (page-locked, portable) host buffer with a numpy view."""

    def __init__(self, n: int, mapped: bool = False):
        flags = HOST_ALLOC_PORTABLE | (HOST_ALLOC_MAPPED if mapped else 0)
        self.n, self.ptr = n, rt().hostAlloc(n, flags)
        self.array = host_view(self.ptr, n)

    def free(self):
        if self.ptr:
            rt().freeHost(self.ptr)
            self.ptr = 0


class Flag:
    """The spin kernel's flag: mapped, portable pinned memory (same address on host and GPUs, UVA).

    Word 0 releases the spin kernel; word 1 is set by the kernel when it gave up waiting.
    """

    def __init__(self):
        self.mem = PinnedHost(64, mapped=True)
        self.cell = ctypes.c_int.from_address(self.mem.ptr)
        self.timeout_cell = ctypes.c_int.from_address(self.mem.ptr + ctypes.sizeof(ctypes.c_int))
        self.cell.value = 0
        self.timeout_cell.value = 0

    def set(self, v: int):
        self.cell.value = v

    def arm(self):
        """Before a sample: the kernel will spin, and no timeout has been seen."""
        self.timeout_cell.value = 0
        self.cell.value = 0

    @property
    def timed_out(self) -> bool:
        return bool(self.timeout_cell.value)


class DeviceKit:
    """Per-GPU resources: src/dst/aux buffers, two non-blocking streams, the kernels, SM count."""

    def __init__(self, index: int, nbytes: int, seed: int, spin_timeout: int):
        cp = cupy()
        self.index, self.nbytes, self.spin_timeout = index, nbytes, spin_timeout
        with on(index):
            r = rt()
            self.src, self.dst, self.aux = (r.malloc(nbytes) for _ in range(3))
            self.streams = [cp.cuda.Stream(non_blocking=True) for _ in range(2)]
            # One RawKernel object per device: it is compiled and loaded for the device it runs on.
            self.k_spin = cp.RawKernel(KERNELS, "spin")
            self.k_copy = cp.RawKernel(KERNELS, "copy_int4")
            props = r.getDeviceProperties(index)
            self.sm_count = int(props["multiProcessorCount"])
            self.l2_bytes = int(props.get("l2CacheSize", 0) or 0)
            self.bus_id = r.deviceGetPCIBusId(index)
            self.name = props["name"]
            self.name = self.name.decode() if isinstance(self.name, bytes) else str(self.name)
            # Random source data, kept on the host to verify every destination afterwards.
            from gpulab.transfer.measure import random_bytes

            self.src_host = random_bytes(nbytes, seed + 1000 * index)
            r.memcpy(self.src, self.src_host.ctypes.data, nbytes, H2D)
            # Compile and load both kernels now: loading a module while the spin kernel holds a
            # stream could wait for it (lazy loading), which would distort the first sample. The
            # flag handed to the warm-up spin is aux (cleared before each use): a zero there makes
            # it time out at once and write its timeout word, which must not land in src.
            self.k_spin((1,), (1,), (np.uint64(self.aux), np.uint64(0)))
            self.k_copy((1,), (32,), (np.uint64(self.aux), np.uint64(self.src), np.uint64(0)))
            r.deviceSynchronize()

    def event(self, timing: bool = True):
        with on(self.index):
            return cupy().cuda.Event(disable_timing=not timing)

    def spin(self, flag: Flag, stream):
        with on(self.index), stream:
            self.k_spin((1,), (1,), (np.uint64(flag.mem.ptr), np.uint64(self.spin_timeout)))

    def sm_copy(self, dst: int, src: int, nbytes: int, stream):
        """Copy kernel on this device (dst may be on a peer with peer access enabled)."""
        n16 = nbytes // 16
        grid = max(1, min(self.sm_count * 4, (n16 + 511) // 512))
        with on(self.index), stream:
            self.k_copy((grid,), (512,), (np.uint64(dst), np.uint64(src), np.uint64(n16)))

    def free(self):
        with on(self.index):
            for p in (self.src, self.dst, self.aux):
                rt().free(p)


def readback_equal(dev_ptr: int, expected: np.ndarray, scratch: PinnedHost) -> bool:
    """Copy ``len(expected)`` bytes back (blocking cudaMemcpy) and compare exactly."""
    n = len(expected)
    rt().memcpy(scratch.ptr, dev_ptr, n, D2H)
    return bool(np.array_equal(scratch.array[:n], expected))


def can_access_peer(i: int, j: int) -> bool:
    return i != j and bool(rt().deviceCanAccessPeer(i, j))


def set_peer_access(i: int, j: int, enable: bool) -> bool:
    """Enable/disable device i's access to j's memory with the raw runtime call; True if changed."""
    err = cupy().cuda.runtime.CUDARuntimeError
    with on(i):
        try:
            (rt().deviceEnablePeerAccess if enable else rt().deviceDisablePeerAccess)(j)
            return True
        except err as exc:
            if exc.status in (ERR_PEER_ALREADY_ENABLED, ERR_PEER_NOT_ENABLED):
                return False
            raise


def peer_access_is_off(i: int, j: int) -> bool:
    """Proof that i -> j peer access was never enabled in this process.

    cudaDeviceDisablePeerAccess answers cudaErrorPeerAccessNotEnabled exactly when it is off; if it
    was on, the call turns it off, and this returns False (the measurement was contaminated).
    """
    err = cupy().cuda.runtime.CUDARuntimeError
    with on(i):
        try:
            rt().deviceDisablePeerAccess(j)
        except err as exc:
            if exc.status == ERR_PEER_NOT_ENABLED:
                return True
            raise
    return False
