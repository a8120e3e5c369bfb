"""The transformer MLP (Linear, GELU, Linear) shared by the ViT-style and Swin families."""
from __future__ import annotations

import torch
from torch import nn


class Mlp(nn.Module):
    """``fc1`` -> GELU -> ``fc2``; the key names are the reference checkpoints'."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))
