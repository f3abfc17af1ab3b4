"""The models the training sweeps use, and the ways they are split across devices.

- :class:`MyNet`: the seed's CNN (chapter 7) adapted to 8x8 digits, with ReLUs added between layers
  (the seed's listing has none) and its dropout optional (0 for the equivalence checks).
- :class:`MLP`: a plain multi-layer perceptron on the flattened digits.
- :class:`TinyGPT`: a small GPT-style decoder for the pipeline- and tensor-parallel runs. Its
  attention infers the number of heads from the projection width, so the same code runs on a full
  layer and on a column-parallel shard that holds only some of the heads.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

DIGITS_CLASSES = 10


class MyNet(nn.Module):
    """Conv(1->32) -> Conv(32->64) -> max-pool -> Linear(256->128->20->10), for 1x8x8 inputs."""

    def __init__(self, dropout: float = 0.0, num_classes: int = DIGITS_CLASSES):
        super().__init__()
        self.seq1 = nn.Sequential(
            nn.Conv2d(1, 32, 3, 1), nn.ReLU(), nn.Dropout2d(dropout),
            nn.Conv2d(32, 64, 3, 1), nn.ReLU(), nn.Dropout2d(dropout),
        )
        # 8x8 -> 6x6 -> 4x4 -> pooled 2x2, times 64 channels.
        self.seq2 = nn.Sequential(
            nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 20), nn.ReLU(), nn.Linear(20, num_classes),
        )

    def forward(self, x):
        x = F.max_pool2d(self.seq1(x), 2)
        return self.seq2(torch.flatten(x, 1))

    def feature_layers(self) -> list[nn.Module]:
        """The layers the 'freeze' technique freezes (the convolutional feature extractor)."""
        return [self.seq1]


class MLP(nn.Module):
    def __init__(self, in_features: int = 64, hidden: tuple[int, ...] = (128, 128),
                 num_classes: int = DIGITS_CLASSES, dropout: float = 0.0):
        super().__init__()
        layers, width = [nn.Flatten()], in_features
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU(), nn.Dropout(dropout)]
            width = h
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(width, num_classes)

    def forward(self, x):
        return self.head(self.body(x))

    def feature_layers(self) -> list[nn.Module]:
        return [self.body]


def build_classifier(name: str, mlp_hidden, dropout: float = 0.0) -> nn.Module:
    if name == "cnn":
        return MyNet(dropout)
    if name == "mlp":
        return MLP(hidden=tuple(mlp_hidden), dropout=dropout)
    raise ValueError(f"unknown model {name!r} (known: cnn, mlp)")


# --- naive model parallel (seed chapter 7): layers placed on devices with .to() ------------------

class NaiveModelParallel(nn.Module):
    """MyNet/MLP with its two halves on (possibly) different devices, activations moved by .to().

    With one device (or CPU virtual devices, which are all the torch CPU device) both halves sit on
    the same device, but the code path, including the .to() hops, is the same.
    """

    def __init__(self, model: nn.Module, devices: list[torch.device]):
        super().__init__()
        if isinstance(model, MyNet):
            first, second = model.seq1, model.seq2
            self._mid = lambda x: torch.flatten(F.max_pool2d(x, 2), 1)
        elif isinstance(model, MLP):
            first, second = model.body, model.head
            self._mid = lambda x: x
        else:
            raise TypeError(f"naive model parallel supports MyNet and MLP, not {type(model).__name__}")
        self.dev_in, self.dev_out = devices[0], devices[-1]
        self.first, self.second = first.to(self.dev_in), second.to(self.dev_out)

    def forward(self, x):
        x = self._mid(self.first(x.to(self.dev_in)))
        return self.second(x.to(self.dev_out))


# --- TinyGPT -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class GPTConfig:
    # Sizes from config train.gpt (its defaults live in the schema).
    vocab: int
    seq_len: int
    d_model: int
    n_heads: int
    n_layers: int

    def __post_init__(self):
        if self.d_model % self.n_heads:
            raise ValueError(f"gpt.d_model ({self.d_model}) must be a multiple of gpt.n_heads "
                             f"({self.n_heads})")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


class Attention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.head_dim = cfg.head_dim
        # Separate q/k/v projections (not one fused qkv) so each can be split column-wise.
        self.q = nn.Linear(cfg.d_model, cfg.d_model)
        self.k = nn.Linear(cfg.d_model, cfg.d_model)
        self.v = nn.Linear(cfg.d_model, cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)

    def forward(self, x):
        b, t, _ = x.shape
        # -1 heads: a tensor-parallel shard holds n_heads / tp of them.
        q, k, v = (m(x).view(b, t, -1, self.head_dim).transpose(1, 2) for m in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, -1))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(cfg.d_model), nn.LayerNorm(cfg.d_model)
        self.attn = Attention(cfg)
        self.fc1 = nn.Linear(cfg.d_model, 4 * cfg.d_model)
        self.fc2 = nn.Linear(4 * cfg.d_model, cfg.d_model)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Embed(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos = nn.Embedding(cfg.seq_len, cfg.d_model)

    def forward(self, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        return self.tok(idx) + self.pos(pos)


class Head(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln = nn.LayerNorm(cfg.d_model)
        self.out = nn.Linear(cfg.d_model, cfg.vocab)

    def forward(self, x):
        return self.out(self.ln(x))


class TinyGPT(nn.Module):
    """Embedding, ``n_layers`` pre-norm transformer blocks, head: a flat list of layers to split."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.layers = nn.ModuleList([Embed(cfg), *(Block(cfg) for _ in range(cfg.n_layers)), Head(cfg)])
        for name, p in self.named_parameters():
            if name.endswith("weight") and p.dim() == 2 and "layers.0." not in name:
                nn.init.normal_(p, std=0.02 / (math.sqrt(2 * cfg.n_layers) if "proj" in name or "fc2" in name else 1))
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx):
        x = idx
        for layer in self.layers:
            x = layer(x)
        return x


def lm_loss(logits, targets):
    """Mean next-token cross-entropy over every position of the batch."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def split_points(n_layers: int, n_stages: int) -> list[tuple[int, int]]:
    """Contiguous [start, end) layer ranges, as even as possible (the earlier stages get the extra)."""
    if n_stages < 1 or n_stages > n_layers:
        raise ValueError(f"cannot split {n_layers} layers into {n_stages} pipeline stages")
    base, extra = divmod(n_layers, n_stages)
    out, start = [], 0
    for s in range(n_stages):
        end = start + base + (1 if s < extra else 0)
        out.append((start, end))
        start = end
    return out


def pipeline_stage_module(model: TinyGPT, stage: int, n_stages: int) -> nn.Sequential:
    """The layers of one pipeline stage (same parameter objects as ``model``)."""
    start, end = split_points(len(model.layers), n_stages)[stage]
    return nn.Sequential(*model.layers[start:end])


def tensor_parallel_plan(model: TinyGPT) -> dict:
    """Megatron-style plan: q/k/v and fc1 split by columns, proj and fc2 by rows; one all-reduce
    after attention and one after the MLP in the forward pass (and the mirror in backward)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    plan = {}
    for i, layer in enumerate(model.layers):
        if isinstance(layer, Block):
            for m in ("attn.q", "attn.k", "attn.v", "fc1"):
                plan[f"layers.{i}.{m}"] = ColwiseParallel()
            for m in ("attn.proj", "fc2"):
                plan[f"layers.{i}.{m}"] = RowwiseParallel()
    return plan


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
