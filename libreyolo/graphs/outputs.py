"""How a graph's named outputs are laid out in its static output buffer, and copied out once.

A replay writes into the same memory every time, so a caller must get a copy or the next
replay overwrites its result. We copy with ONE device-to-device copy per call:

- one output (every detector today): the graph's output tensor is the static buffer and the
  copy-out is a single ``clone()``;
- several outputs: the captured function packs them into one flat byte buffer (a ``cat``
  recorded *inside* the graph, so it costs device bandwidth but no extra launch per call),
  the copy-out clones that buffer once, and the caller gets views into the clone.

The trade-off: packing moves the output bytes twice on the device (pack + copy-out) instead
of once per tensor, but launches one copy instead of one per output; at the sizes that graphs
serve (launch-bound networks, a few MB of outputs) one launch is the cheaper side. Outputs
are ordered by descending element size inside the buffer so every view is aligned.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class OutputSlot:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    offset: int  # bytes from the start of the packed buffer
    nbytes: int


class OutputLayout:
    """Pack {name: tensor} into one buffer inside the graph; unpack views of its copy outside."""

    def __init__(self, outputs: dict[str, torch.Tensor]) -> None:
        if not isinstance(outputs, dict) or not outputs:
            raise TypeError(f"a graphed function must return a non-empty dict of tensors, got {type(outputs).__name__}")
        bad = [k for k, v in outputs.items() if not isinstance(v, torch.Tensor)]
        if bad:
            raise TypeError(f"graphed outputs must all be tensors; not tensors: {bad}")
        self.names = tuple(outputs)
        order = sorted(self.names, key=lambda n: -outputs[n].element_size())  # stable: keeps ties in order
        slots, offset = {}, 0
        for name in order:
            t = outputs[name]
            nbytes = t.numel() * t.element_size()
            slots[name] = OutputSlot(name, tuple(t.shape), t.dtype, offset, nbytes)
            offset += nbytes
        self.order = tuple(order)
        self.slots = slots
        self.nbytes = offset
        self.single = self.names[0] if len(self.names) == 1 else None

    def pack(self, outputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """The one tensor that becomes the static output (runs inside the capture)."""
        if self.single is not None:
            return outputs[self.single]
        return torch.cat([outputs[n].reshape(-1).view(torch.uint8) for n in self.order])

    def unpack(self, packed: torch.Tensor) -> dict[str, torch.Tensor]:
        """{name: tensor} viewing ``packed`` (a fresh copy of the static output)."""
        if self.single is not None:
            return {self.single: packed}
        out = {}
        for name in self.names:
            s = self.slots[name]
            out[name] = packed[s.offset:s.offset + s.nbytes].view(s.dtype).view(s.shape)
        return out

    def describe(self) -> dict[str, dict]:
        return {n: {"shape": list(self.slots[n].shape), "dtype": dtype_name(self.slots[n].dtype)} for n in self.names}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
