"""Building blocks shared by the DETR-style detectors (``rtdetr``, ``dfine``).

Not a family: nothing here registers itself. Submodule names inside these blocks are part of
the reference checkpoint format (schema 1.0), so they stay as they are.
"""
from __future__ import annotations

from libreyolo.models.detr_shared.anchors import AnchorCache, make_anchors
from libreyolo.models.detr_shared.encoder import HybridEncoder
from libreyolo.models.detr_shared.layers import (
    MLP,
    ConvNormLayer,
    FrozenBatchNorm2d,
    MultiheadAttention,
    RepVggBlock,
    TransformerEncoder,
    TransformerEncoderLayer,
    inverse_sigmoid,
    sincos_position_embedding,
)

__all__ = [
    "MLP",
    "AnchorCache",
    "ConvNormLayer",
    "FrozenBatchNorm2d",
    "HybridEncoder",
    "MultiheadAttention",
    "RepVggBlock",
    "TransformerEncoder",
    "TransformerEncoderLayer",
    "inverse_sigmoid",
    "make_anchors",
    "sincos_position_embedding",
]
