"""All-reduce written by hand over point-to-point send/recv: ring, binary tree, parameter server.

Every exchange goes through ``dist.batch_isend_irecv``: with NCCL a lone blocking send can wait
forever for a peer that is itself stuck in a send, while a batch is one NCCL group whose sends and
receives progress together. Both ends of every transfer post their operations in the same order,
which is what NCCL and gloo match point-to-point messages by. ``work.wait()`` blocks the host on
gloo and only orders the current CUDA stream after the transfer on NCCL, so on a GPU the host posts
the whole pipeline ahead and the device overlaps transfers of slice k+1 with the reduction of
slice k.

Pipelining: each buffer (ring: each of the n chunks) is cut into ``slices``. A slice moves on as
soon as it is ready, independently of the other slices of its chunk.
"""
from __future__ import annotations

from gpulab.collectives import formulas
from gpulab.collectives.bench import Case
from gpulab.collectives.data import WEIGHTS, Patterns, compare


def _batch(ops):
    """Post (send|recv, tensor, peer) operations as one group; empty tensors are skipped on both ends."""
    import torch.distributed as dist

    p2p = [dist.P2POp(dist.isend if kind == "send" else dist.irecv, t, peer)
           for kind, t, peer in ops if t.numel() > 0]
    return dist.batch_isend_irecv(p2p) if p2p else []


def _wait(works):
    for w in works:
        w.wait()


def _split(t, k):
    import torch

    return torch.tensor_split(t, k)


def ring_allreduce(buf, tmp, rank: int, n: int, slices: int) -> None:
    """In-place sum over n ranks: reduce-scatter then all-gather around the ring rank -> rank+1.

    tmp: scratch of at least 2 * ceil(numel / n) elements (one chunk per step parity).
    """
    if n == 1:
        return
    right, left = (rank + 1) % n, (rank - 1) % n
    chunks = _split(buf, n)
    width = chunks[0].numel()
    # Two scratch chunks: step s receives into scratch[s % 2]; step s+2 reuses it only after every
    # reduction of step s has been queued (so NCCL, which waits on the current stream, cannot race).
    scratch = (tmp[:width], tmp[width:2 * width])

    def rs_post(s, k):
        cs, cr = (rank - s) % n, (rank - s - 1) % n
        recv = _split(scratch[s % 2][:chunks[cr].numel()], slices)[k]
        return _batch([("send", _split(chunks[cs], slices)[k], right), ("recv", recv, left)])

    def ag_post(s, k):
        cs, cr = (rank + 1 - s) % n, (rank - s) % n
        return _batch([("send", _split(chunks[cs], slices)[k], right),
                       ("recv", _split(chunks[cr], slices)[k], left)])

    works = {(0, k): rs_post(0, k) for k in range(slices)}
    for s in range(n - 1):  # reduce-scatter: after it, this rank holds the full sum of chunk rank+1
        cr = (rank - s - 1) % n
        dst, src = _split(chunks[cr], slices), _split(scratch[s % 2][:chunks[cr].numel()], slices)
        for k in range(slices):
            _wait(works.pop((s, k)))
            dst[k].add_(src[k])
            # The slice just reduced is the one this rank sends next: it goes on at once.
            works[(s + 1, k)] = rs_post(s + 1, k) if s + 1 < n - 1 else ag_post(0, k)
    ag = {k: works.pop((n - 1, k)) for k in range(slices)}
    for s in range(n - 1):  # all-gather: pass the finished chunks around the ring
        for k in range(slices):
            _wait(ag.pop(k))
            if s + 1 < n - 1:
                ag[k] = ag_post(s + 1, k)


def binary_tree(rank: int, n: int):
    """(parent, children) in the binary tree rooted at rank 0."""
    return ((rank - 1) // 2 if rank else None), [c for c in (2 * rank + 1, 2 * rank + 2) if c < n]


def star(rank: int, n: int):
    """(parent, children) with rank 0 as the parameter server."""
    return (0 if rank else None), (list(range(1, n)) if rank == 0 else [])


def tree_reduce(buf, tmp, parent, children, slices: int) -> None:
    """Sum every rank's buf into the root's buf, slice by slice (tmp: len(children) slices)."""
    parts = _split(buf, slices)
    width = parts[0].numel()
    slots = [tmp[i * width:(i + 1) * width] for i in range(len(children))]

    def post(k):  # send slice k-1 up, receive slice k from the children
        ops = [("send", parts[k - 1], parent)] if k >= 1 and parent is not None else []
        if k < slices:
            ops += [("recv", slot[:parts[k].numel()], c) for slot, c in zip(slots, children)]
        return _batch(ops)

    works = post(0)
    for k in range(slices):
        _wait(works)
        for slot in slots:
            parts[k].add_(slot[:parts[k].numel()])
        works = post(k + 1)
    _wait(works)


def tree_broadcast(buf, parent, children, slices: int) -> None:
    """Copy the root's buf down the tree, slice by slice."""
    parts = _split(buf, slices)

    def post(k):  # send slice k-1 down, receive slice k from the parent
        ops = [("send", parts[k - 1], c) for c in children] if k >= 1 else []
        if k < slices and parent is not None:
            ops.append(("recv", parts[k], parent))
        return _batch(ops)

    works = post(0)
    for k in range(slices):
        _wait(works)
        works = post(k + 1)
    _wait(works)


def tree_allreduce(buf, tmp, rank: int, n: int, slices: int) -> None:
    parent, children = binary_tree(rank, n)
    tree_reduce(buf, tmp, parent, children, slices)
    tree_broadcast(buf, parent, children, slices)


def param_server_step(grad, weights, tmp, rank: int, n: int, slices: int) -> None:
    """Workers push gradients to the server (rank 0, which also holds a gradient of its own); the
    server applies w -= sum(grad) (learning rate 1 keeps integers exact); every worker pulls w."""
    parent, children = star(rank, n)
    tree_reduce(grad, tmp, parent, children, slices)
    if rank == 0:
        weights.sub_(grad)
    tree_broadcast(weights, parent, children, slices)


def num_slices(numel: int, slice_bytes: int, max_slices: int) -> int:
    """Pipeline depth: slices of about slice_bytes, at least 1, at most max_slices and numel."""
    want = -(-numel * formulas.ELEMENT_BYTES // max(1, slice_bytes))
    return max(1, min(want, max_slices, numel))


def make_case(alg: str, size_bytes: int, pats: Patterns, rank: int, n: int, slice_bytes: int,
              max_slices: int) -> Case:
    import torch

    sh = formulas.shape("all_reduce", size_bytes, n)
    total, dev = sh.total, pats.device
    if alg == "ring":
        slices = num_slices(-(-total // n), slice_bytes, max_slices)
        scratch = 2 * -(-total // n)
    elif alg in ("tree", "param_server"):
        slices = num_slices(total, slice_bytes, max_slices)
        fan_out = len((binary_tree if alg == "tree" else star)(rank, n)[1])
        scratch = fan_out * -(-total // slices)
    else:
        raise ValueError(f"unknown hand-written algorithm {alg!r} (known: {formulas.HANDWRITTEN})")
    tmp = torch.empty(max(1, scratch), dtype=torch.float32, device=dev)
    buf = pats.rank_buffer(rank, total)
    orig = buf.clone()
    info = {"slices": slices}
    if alg == "param_server":
        w0 = pats.rank_buffer(WEIGHTS, total)
        weights = w0.clone()

        def restore():
            buf.copy_(orig)
            weights.copy_(w0)

        return Case("handwritten", alg, "in-place", sh.bytes, total,
                    lambda: param_server_step(buf, weights, tmp, rank, n, slices), restore,
                    lambda: compare(weights, w0 - pats.sum_buffer(total)), weights, info)
    fn = ring_allreduce if alg == "ring" else tree_allreduce
    return Case("handwritten", alg, "in-place", sh.bytes, total,
                lambda: fn(buf, tmp, rank, n, slices), lambda: buf.copy_(orig),
                lambda: compare(buf, pats.sum_buffer(total)), buf, info)
