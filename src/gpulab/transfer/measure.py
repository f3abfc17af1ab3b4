"""Counting conventions and the one row shape every transfer measurement is summarised into.

Conventions (stated in the report and in the result's ``conventions`` attribute):
- bytes are counted once per direction; GB/s = 1e9 B/s;
- a copy whose source and destination are on the same device moves every byte twice (one read,
  one write), so same-device bandwidth counts read+write, as p2pBandwidthLatencyTest does;
- bidirectional bandwidth is the sum of both directions;
- a sample times ``copies`` back-to-back copies; latency is the sample time divided by ``copies``.
"""
from __future__ import annotations

import json
import math

import numpy as np

from gpulab import timing

CONVENTIONS = (
    "bytes counted once per direction; GB/s = 1e9 B/s; same-device copies count read+write (x2), "
    "as the datasheet memory bandwidth does; bidirectional = sum of both directions; latency = "
    "sample time / copies in the sample; median over samples, min/max reported; at most 256 "
    "copies queued per stream per sample; cache_resident rows fit in L2 (not memory bandwidth)"
)
# Operations queued on one stream per sample behind the spin kernel. An H200 stream holds between
# 1000 and 1500 queued operations; past that the host blocks while queueing, the spin kernel times
# out and small-size figures drop by about 2x. 256 stays well below on every GPU we know of.
MAX_QUEUED = 256
MAX_COPIES = MAX_QUEUED  # cap on back-to-back copies per sample in size sweeps (small sizes)
# Host <-> device copies this small are over before the host has issued the next one: a sample of
# them times how fast the host issues cudaMemcpyAsync calls, not the PCIe link (issue 24). Their
# rows say so (column ``bound_by``) and they judge no link.
ISSUE_BOUND_BYTES = 64 << 10
ISSUE_BOUND = "issue-rate bound, not link bound"


def bound_by(nbytes: int) -> str:
    """What a host <-> device row of ``nbytes`` per copy measures: the issue rate or the link."""
    return ISSUE_BOUND if int(nbytes) <= ISSUE_BOUND_BYTES else "link"


def copies_for(size: int, minimum: int, target_bytes: int) -> int:
    """Back-to-back copies per sample: enough to move ``target_bytes``, at least ``minimum``,
    at most MAX_COPIES."""
    return int(min(MAX_COPIES, max(minimum, math.ceil(target_bytes / max(size, 1)))))


def bytes_moved(nbytes: int, copies: int, *, same_device: bool, bidirectional: bool = False) -> int:
    """Bytes one sample moves under the conventions above."""
    return nbytes * copies * (2 if bidirectional else 1) * (2 if same_device else 1)


def samples_json(samples) -> str:
    """Every repetition's seconds, kept so baselines and the fleet view can test against noise."""
    return json.dumps([float(f"{x:.6g}") for x in samples])


def bandwidth_row(samples_s, moved: int, **keys) -> dict:
    """A tidy row for a bandwidth measurement: time stats (s) and GB/s (max from the fastest)."""
    st = timing.summarize(samples_s)
    return {**keys, "bytes_per_sample": int(moved),
            "time_s_median": st.median, "time_s_min": st.min, "time_s_max": st.max,
            "value_median": moved / st.median / 1e9, "value_min": moved / st.max / 1e9,
            "value_max": moved / st.min / 1e9, "spread": st.spread, "repeats": st.n,
            "unit": "GB/s", "samples_s": samples_json(st.samples)}


def latency_row(samples_s, copies: int, **keys) -> dict:
    """A tidy row for a latency measurement: microseconds per copy."""
    st = timing.summarize(samples_s)
    return {**keys, "copies": copies, "bytes_per_sample": 0,
            "time_s_median": st.median, "time_s_min": st.min, "time_s_max": st.max,
            "value_median": st.median / copies * 1e6, "value_min": st.min / copies * 1e6,
            "value_max": st.max / copies * 1e6, "spread": st.spread, "repeats": st.n,
            "unit": "us", "samples_s": samples_json(st.samples)}


def random_bytes(n: int, seed: int) -> np.ndarray:
    """Random payload (never zeros) so a stale or zeroed destination fails verification."""
    return np.frombuffer(np.random.default_rng(seed).bytes(n), dtype=np.uint8).copy()
