"""The module that is traced/exported: the family's network reduced to its export contract."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from libreyolo.export.e2e import E2EInput
from libreyolo.export.nms import OUTPUT_AXES as NMS_AXES
from libreyolo.export.nms import OUTPUT_NAMES as NMS_NAMES
from libreyolo.export.nms import EmbeddedNMS
from libreyolo.models.base import Family


class ExportModule(nn.Module):
    """``images -> tuple of outputs`` exactly as named by :meth:`output_names`."""

    def __init__(self, net: nn.Module, family: Family, nms: dict[str, Any] | None = None,
                 nc: int | None = None, e2e: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.net = net
        # end-to-end: uint8 RGB pixels in, the family's normalisation first (libreyolo.export.e2e)
        self.pixels = E2EInput(e2e) if e2e is not None else None
        self.family = family
        self.nc = nc
        self.nms = None
        if nms is not None:
            params = {k: v for k, v in nms.items() if k in ("topk", "iterations", "iou", "conf", "max_det")}
            self.nms = EmbeddedNMS(int(nc or 0), **params)

    @property
    def contract(self):
        return self.family.export

    def output_names(self) -> tuple[str, ...]:
        return NMS_NAMES if self.nms is not None else self.contract.output_names

    def output_axes(self, dynamic_spatial: bool) -> dict[str, dict[int, str]]:
        axes = NMS_AXES if self.nms is not None else self.contract.output_axes
        # every axis the contract declares follows an input axis: the batch always, the others
        # (anchors, height, width, ...) when the input's spatial size is dynamic too
        return {name: {int(a): n for a, n in axes.get(name, {}).items() if dynamic_spatial or n == "batch"}
                for name in self.output_names()}

    def fixed_output_dims(self) -> dict[str, dict[int, int]]:
        """Output sizes the contract fixes whatever the input size: the class axis (``nc + offset``)."""
        if self.nms is not None or self.nc is None:
            return {}
        return {out: {axis: int(self.nc) + offset} for out, (axis, offset) in self.contract.class_axes.items()}

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.pixels is not None:
            images = self.pixels(images)
        outputs = self.family.export_outputs(self.net(images))
        if self.nms is None:
            return tuple(outputs)
        named = dict(zip(self.contract.output_names, outputs, strict=True))
        return self.nms(named[self.contract.nms_output()], images)

    def run(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        """Eager reference outputs by name (what the artifact must reproduce)."""
        with torch.inference_mode():
            return dict(zip(self.output_names(), self(images), strict=True))
