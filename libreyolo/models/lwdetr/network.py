"""LW-DETR (t, s, m, l, x): a windowed plain ViT, the multi-scale projector, the LW-DETR decoder.

The table ``SIZES`` is the reference's (ViT width, heads and depth, windowed blocks, output
blocks, projector levels, decoder width and heads, sampling points, queries). The class head is
91 logits wide for the 80 COCO classes (one column per COCO category id, as the released weights
are) and ``nc`` wide otherwise. The network returns ``pred_logits`` and ``pred_boxes`` of the last
decoder layer.
"""
from __future__ import annotations

from dataclasses import dataclass

from libreyolo.models.detr_shared.lw import LWDETR, LWBackbone, LWConfig
from libreyolo.models.detr_shared.projector import SCALE_OF_LEVEL, MultiScaleProjector
from libreyolo.models.lwdetr.vit import PATCH, ViT

COCO_HEAD = 91  # columns of the COCO-80 head: one per COCO category id 0..90


@dataclass(frozen=True)
class LWDETRSize:
    vit_width: int
    vit_heads: int
    vit_depth: int
    window_blocks: tuple[int, ...]
    out_indices: tuple[int, ...]
    levels: tuple[str, ...]
    hidden: int
    sa_heads: int
    ca_heads: int
    points: int
    num_queries: int


_BIG = dict(window_blocks=(0, 1, 3, 6, 7, 9), out_indices=(2, 4, 5, 9))
SIZES: dict[str, LWDETRSize] = {
    "t": LWDETRSize(192, 12, 6, (0, 2, 4), (1, 3, 5), ("P4",), 256, 8, 16, 2, 100),
    "s": LWDETRSize(192, 12, 10, **_BIG, levels=("P4",), hidden=256, sa_heads=8, ca_heads=16, points=2,
                    num_queries=300),
    "m": LWDETRSize(384, 12, 10, **_BIG, levels=("P4",), hidden=256, sa_heads=8, ca_heads=16, points=2,
                    num_queries=300),
    "l": LWDETRSize(384, 12, 10, **_BIG, levels=("P3", "P5"), hidden=384, sa_heads=12, ca_heads=24, points=4,
                    num_queries=300),
    "x": LWDETRSize(768, 12, 10, **_BIG, levels=("P3", "P5"), hidden=384, sa_heads=12, ca_heads=24, points=4,
                    num_queries=300),
}


def head_width(nc: int) -> int:
    """Logits per query for ``nc`` classes: the COCO layout for 80, one per class otherwise."""
    if nc == COCO_HEAD:
        raise ValueError(f"lwdetr cannot have {COCO_HEAD} classes: a {COCO_HEAD}-wide head is the COCO-80 layout")
    return COCO_HEAD if nc == 80 else nc


class LWDETRNet(LWDETR):
    def __init__(self, size: str, nc: int = 80) -> None:
        if size not in SIZES:
            raise ValueError(f"unknown lwdetr size {size!r}; known sizes: {', '.join(SIZES)}")
        s = SIZES[size]
        cfg = LWConfig(hidden=s.hidden, sa_heads=s.sa_heads, ca_heads=s.ca_heads, points=s.points,
                       levels=len(s.levels), dec_layers=3, num_queries=s.num_queries, group_detr=13)
        encoder = ViT(s.vit_width, s.vit_heads, s.vit_depth, s.window_blocks, s.out_indices)
        projector = MultiScaleProjector([s.vit_width] * len(s.out_indices), s.hidden, s.levels)
        super().__init__(LWBackbone(encoder, projector), cfg, head_width(nc),
                         first_stride=round(PATCH / SCALE_OF_LEVEL[s.levels[0]]))
        self.size, self.nc = size, nc
