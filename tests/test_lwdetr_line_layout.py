"""Every size of the LW-DETR line (rfdetr n/s/m/l, lwdetr t/s/m/l/x) has the reference's layout.

The fixtures cover rfdetr-n and lwdetr-t only. For the other sizes the reference's size tables are
written here as data (read from libreyolo 1.6.0 as facts: ``models/rfdetr/nn.py`` RFDETR_CONFIGS
and RFDETRSizeConfig defaults, the dinov2_windowed_small config in ``models/rfdetr/backbone.py``;
``models/lwdetr/nn.py`` LWDETR_CONFIGS, _SHARED_CONFIG and _VIT_VARIANTS), and each size is built on
the meta device and its state-dict key shapes checked against what those tables imply. A wrong
width, depth, head count, point count, query count or projector level fails (mutation check:
giving lwdetr-l ``points=2`` fails on its sampling_offsets shape).
"""
from __future__ import annotations

import re

import pytest
import torch

from libreyolo.models.registry import get_family

# RF-DETR (detection): resolution, decoder layers; shared: DINOv2-S (384 wide, 12 blocks), patch 16,
# 2 windows, hidden 256, 8 self-attention heads, 16 deformable heads, 2 points, 300 queries, 13
# Group-DETR groups, projector P4 from blocks (3, 6, 9, 12), FFN 2048, nc + 1 logits.
RFDETR_TABLE = {"n": (384, 2), "s": (512, 3), "m": (576, 4), "l": (704, 4)}
# LW-DETR: ViT (width, blocks), output blocks, projector levels, hidden, self/deformable heads,
# points, queries; shared: 3 decoder layers, 13 groups, 224 px pretraining grid (14 x 14 + cls),
# patch 16, FFN 2048, 91 logits for COCO-80.
LWDETR_TABLE = {
    "t": ((192, 6), (1, 3, 5), ("P4",), 256, 8, 16, 2, 100),
    "s": ((192, 10), (2, 4, 5, 9), ("P4",), 256, 8, 16, 2, 300),
    "m": ((384, 10), (2, 4, 5, 9), ("P4",), 256, 8, 16, 2, 300),
    "l": ((384, 10), (2, 4, 5, 9), ("P3", "P5"), 384, 12, 24, 4, 300),
    "x": ((768, 10), (2, 4, 5, 9), ("P3", "P5"), 384, 12, 24, 4, 300),
}


def _shapes(family: str, size: str, nc: int = 80) -> dict[str, tuple[int, ...]]:
    with torch.device("meta"):
        net = get_family(family).build(size, nc)
    return {k: tuple(v.shape) for k, v in net.state_dict().items()}


def _count(shapes: dict, pattern: str) -> int:
    return len({m.group(1) for k in shapes if (m := re.match(pattern, k))})


def _decoder_checks(sd: dict, hidden: int, ca_heads: int, levels: int, points: int, layers: int,
                    queries: int, logits: int) -> None:
    assert _count(sd, r"transformer\.decoder\.layers\.(\d+)\.") == layers
    assert sd["transformer.decoder.layers.0.cross_attn.sampling_offsets.weight"] == (ca_heads * levels * points * 2,
                                                                                     hidden)
    assert sd["transformer.decoder.layers.0.cross_attn.attention_weights.weight"] == (ca_heads * levels * points,
                                                                                      hidden)
    assert sd["transformer.decoder.layers.0.self_attn.in_proj_weight"] == (3 * hidden, hidden)
    assert sd["transformer.decoder.layers.0.linear1.weight"] == (2048, hidden)
    assert sd["transformer.decoder.ref_point_head.layers.0.weight"] == (hidden, 2 * hidden)
    assert sd["refpoint_embed.weight"] == (queries * 13, 4)
    assert sd["query_feat.weight"] == (queries * 13, hidden)
    assert sd["class_embed.weight"] == (logits, hidden)
    assert _count(sd, r"transformer\.enc_out_class_embed\.(\d+)\.") == 13
    assert _count(sd, r"transformer\.enc_output\.(\d+)\.") == 13
    assert sd["transformer.enc_out_class_embed.12.bias"] == (logits,)


@pytest.mark.parametrize("size", sorted(RFDETR_TABLE))
def test_every_rfdetr_size_has_the_reference_layout(size):
    resolution, layers = RFDETR_TABLE[size]
    sd = _shapes("rfdetr", size)
    pe = resolution // 16
    assert sd["backbone.0.encoder.encoder.embeddings.position_embeddings"] == (1, pe * pe + 1, 384)
    assert sd["backbone.0.encoder.encoder.embeddings.patch_embeddings.projection.weight"] == (384, 3, 16, 16)
    assert _count(sd, r"backbone\.0\.encoder\.encoder\.encoder\.layer\.(\d+)\.") == 12
    assert sd["backbone.0.encoder.encoder.encoder.layer.11.mlp.fc1.weight"] == (1536, 384)
    assert sd["backbone.0.projector.stages.0.0.cv1.conv.weight"] == (256, 4 * 384, 1, 1)
    assert sd["backbone.0.projector.stages.0.0.cv2.conv.weight"] == (256, 5 * 128, 1, 1)
    assert "backbone.0.projector.stages.0.0.cv1.bn.running_mean" not in sd  # channel LayerNorm, not BatchNorm
    assert _count(sd, r"backbone\.0\.projector\.stages\.(\d+)\.") == 1
    assert sd["_kp_active_mask"] == (0, 0)
    _decoder_checks(sd, 256, 16, 1, 2, layers, 300, 81)
    assert get_family("rfdetr").default_imgsz_for(size) == resolution


@pytest.mark.parametrize("size", sorted(LWDETR_TABLE))
def test_every_lwdetr_size_has_the_reference_layout(size):
    (width, blocks), outs, levels, hidden, _sa, ca, points, queries = LWDETR_TABLE[size]
    sd = _shapes("lwdetr", size)
    assert sd["backbone.0.encoder.pos_embed"] == (1, 14 * 14 + 1, width)
    assert sd["backbone.0.encoder.blocks.0.attn.qkv.weight"] == (3 * width, width)
    assert sd["backbone.0.encoder.blocks.0.attn.q_bias"] == (width,)
    assert "backbone.0.encoder.blocks.0.attn.qkv.bias" not in sd
    assert _count(sd, r"backbone\.0\.encoder\.blocks\.(\d+)\.") == blocks
    assert _count(sd, r"backbone\.0\.projector\.stages\.(\d+)\.") == len([lv for lv in levels if lv != "P6"])
    # the first level's C2f input: every output block's map, resampled for that level
    first = {"P3": width // 4 if width > 512 else width // 2, "P4": width, "P5": width}[levels[0]]
    assert sd["backbone.0.projector.stages.0.0.cv1.conv.weight"] == (hidden, len(outs) * first, 1, 1)
    assert "backbone.0.projector.stages.0.0.cv1.bn.running_mean" in sd  # BatchNorm
    _decoder_checks(sd, hidden, ca, len(levels), points, 3, queries, 91)
    assert _shapes("lwdetr", size, nc=3)["class_embed.weight"] == (3, hidden)


def test_lwdetr_refuses_91_classes_and_reads_a_coco_head_as_80():
    fam = get_family("lwdetr")
    with pytest.raises(ValueError, match="COCO-80"):
        fam.build("t", 91)
    assert fam.state_nc({"class_embed.bias": torch.zeros(91)}) == 80
    assert fam.state_nc({"class_embed.bias": torch.zeros(7)}) == 7
    assert get_family("rfdetr").state_nc({"class_embed.bias": torch.zeros(81)}) == 80


@pytest.mark.parametrize(("stem", "family", "size", "imgsz"), [("LibreRFDETRn", "rfdetr", "n", 384),
                                                               ("LibreLWDETRt", "lwdetr", "t", 640)])
def test_yaml_names_build_untrained_and_checkpoints_round_trip(stem, family, size, imgsz, tmp_path):
    from libreyolo import LibreYOLO

    model = LibreYOLO(f"{stem}.yaml", nc=3)  # built here: no backbone is downloaded
    assert (model.family.name, model.size, model.nc, model.imgsz) == (family, size, 3, imgsz)
    path = model.save(tmp_path / f"{stem}.pt")
    again = LibreYOLO(path)
    assert (again.family.name, again.size, again.nc, again.imgsz) == (family, size, 3, imgsz)
    mine, theirs = model.net.state_dict(), again.net.state_dict()
    assert list(mine) == list(theirs) and all(torch.equal(mine[k], theirs[k]) for k in mine)
    r = again(torch.zeros(3, 120, 160, dtype=torch.uint8), conf=0.0)
    assert len(r) > 0 and float(r.boxes.cls.max()) < 3 + (family == "rfdetr")  # rfdetr's extra column
