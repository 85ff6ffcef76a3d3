"""A tiny GPT and the synthetic task it learns, shared by the example training scripts.

Small enough for CPU (d_model 64, 4 layers, vocab 64, seq 32): a few hundred steps
with 4 ranks take seconds. The task: counting modulo the vocabulary with a random
start and stride, so the loss falls visibly within a few hundred steps.

Resuming must equal not stopping, so nothing here keeps hidden state: the batch of
step ``s`` on data-parallel rank ``d`` is a pure function of (seed, s, d), the model
has no dropout, and the only state is parameters + optimizer (+ the step).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

@dataclass(frozen=True)
class Config:
    vocab: int = 64
    seq: int = 32
    d_model: int = 64
    n_heads: int = 4
    n_layers: int = 4
    batch: int = 8  # per data-parallel rank
    lr: float = 3e-3


def batch_for(cfg: Config, seed: int, step: int, dp_rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets) of shape (batch, seq) for one step on one data-parallel rank.

    Each row counts modulo the vocabulary from a random start with a random stride
    (1..7): after two tokens the rest is predictable, so the loss falls from ln(vocab)
    within a few hundred steps.
    """
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step * 1009 + dp_rank)
    start = torch.randint(0, cfg.vocab, (cfg.batch, 1), generator=gen)
    stride = torch.randint(1, 8, (cfg.batch, 1), generator=gen)
    tokens = (start + stride * torch.arange(cfg.seq + 1)) % cfg.vocab
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


class Attention(nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.head_dim = cfg.d_model // cfg.n_heads
        self.q = nn.Linear(cfg.d_model, cfg.d_model)
        self.k = nn.Linear(cfg.d_model, cfg.d_model)
        self.v = nn.Linear(cfg.d_model, cfg.d_model)
        self.o = nn.Linear(cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        # -1 heads: under tensor parallelism q/k/v hold only this rank's heads
        q, k, v = (lin(x).view(b, t, -1, self.head_dim).transpose(1, 2)
                   for lin in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.fc1 = nn.Linear(cfg.d_model, 4 * cfg.d_model)
        self.fc2 = nn.Linear(4 * cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(cfg.d_model), Attention(cfg)
        self.ln2, self.mlp = nn.LayerNorm(cfg.d_model), MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Embedding, blocks, head. Parts set to None are absent on a pipeline stage; the
    blocks sit in a ModuleDict keyed by their global index so every stage's parameter
    names match the full model's (checkpoints stay layout-independent)."""

    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_emb: nn.Module | None = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos_emb: nn.Module | None = nn.Embedding(cfg.seq, cfg.d_model)
        self.layers = nn.ModuleDict({str(i): Block(cfg) for i in range(cfg.n_layers)})
        self.norm: nn.Module | None = nn.LayerNorm(cfg.d_model)
        self.head: nn.Module | None = nn.Linear(cfg.d_model, cfg.vocab, bias=False)
        for name, p in self.named_parameters():
            if p.dim() == 2:  # GPT-2 style init, scaled for the residual projections
                residual = name.endswith(("o.weight", "fc2.weight"))
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * cfg.n_layers) if residual else 0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tok_emb is not None:  # first stage: token ids in
            pos = torch.arange(x.shape[1], device=x.device)
            x = self.tok_emb(x) + self.pos_emb(pos)
        for layer in self.layers.values():
            x = layer(x)
        if self.norm is not None:  # last stage: logits out
            x = self.head(self.norm(x))
        return x


def keep_stage(model: GPT, stage: int, stages: int) -> GPT:
    """Cut ``model`` down to pipeline stage ``stage`` of ``stages`` (contiguous layers)."""
    n = model.cfg.n_layers
    if n % stages:
        raise ValueError(f"n_layers={n} does not split into pp={stages} stages: "
                         f"choose pp dividing {n}")
    lo, hi = stage * n // stages, (stage + 1) * n // stages
    for i in list(model.layers.keys()):
        if not lo <= int(i) < hi:
            del model.layers[i]
    if stage != 0:
        model.tok_emb = model.pos_emb = None
    if stage != stages - 1:
        model.norm = model.head = None
    return model


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def param_count(cfg: Config) -> int:
    """The full model's parameters (every stage and shard together): its FLOPs per token
    are 6 times that to train, which ``ctx.set_work(params=...)`` tells hpctrain report."""
    return sum(p.numel() for p in GPT(cfg).parameters())
