"""RT-DETR (and RT-DETRv2, the same layout) cut at its query selection, for formats that have no top-k or
gather (NCNN).

The network becomes two programs: the *head* (backbone, encoder and the encoder's score/box heads:
``images -> memory, output_memory, enc_logits, enc_boxes_unact``, every candidate) and the *tail*
(the decoder: ``target, ref_unact, memory -> pred_logits, pred_boxes``). Between them the host runs
:func:`~libreyolo.models.rtdetr.decoder.select_queries`, the function the eager model runs, on the
head's outputs. ``SetContract.host_selection`` names :data:`SPLIT`; the NCNN exporter and runtime
read only the attributes below, never the family's name.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from libreyolo.models.rtdetr.decoder import Shapes, select_queries


class _Head(nn.Module):
    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
        enc = self.net.decoder.encode(self.net.encoder(self.net.backbone(images)))
        return enc.memory, enc.output_memory, enc.logits, enc.boxes_unact


class _Tail(nn.Module):
    def __init__(self, net: nn.Module, shapes: Shapes) -> None:
        super().__init__()
        self.net, self.shapes = net, [tuple(s) for s in shapes]

    def forward(self, target: torch.Tensor, ref_unact: torch.Tensor, memory: torch.Tensor) -> dict[str, torch.Tensor]:
        return self.net.decoder.decode(target, ref_unact, memory, self.shapes)


class QuerySelectionSplit:
    """The head/tail programs of a network with RT-DETR's layout (``backbone``, ``encoder`` and an
    :class:`~libreyolo.models.rtdetr.decoder.RTDETRTransformer` ``decoder``) and the host step between."""

    head_outputs = ("memory", "output_memory", "enc_logits", "enc_boxes_unact")
    tail_inputs = ("target", "ref_unact", "memory")

    def programs(self, net: nn.Module, images: torch.Tensor) -> tuple[nn.Module, nn.Module]:
        """(head, tail) modules of ``net`` for inputs of ``images``' size (the tail's level shapes are fixed)."""
        with torch.no_grad():
            shapes = net.decoder.encode(net.encoder(net.backbone(images))).shapes
        return _Head(net), _Tail(net, shapes)

    def params(self, net: nn.Module) -> dict[str, Any]:
        """What :meth:`select` needs besides the head's outputs (recorded in the artifact)."""
        return {"num_queries": int(net.decoder.num_queries)}

    def select(self, head: dict[str, torch.Tensor], num_queries: int) -> dict[str, torch.Tensor]:
        """The tail's inputs from the head's outputs: the eager model's query selection."""
        _, target, ref_unact = select_queries(head["enc_logits"], head["enc_boxes_unact"], head["output_memory"],
                                              num_queries)
        return {"target": target, "ref_unact": ref_unact, "memory": head["memory"]}


SPLIT = QuerySelectionSplit()
