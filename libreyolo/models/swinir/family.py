"""The swinir family adapter (restore): sizes s, m and l, all 4x, as the reference library offers them.

``s`` is the lightweight model (pixel-shuffle upsampler), ``m`` and ``l`` the real-world models
(nearest-neighbour + convolution upsampler; ``l`` with bottleneck residual convolutions). The
reference's checkpoints are named ``LibreSwinIR<size>.pt`` and carry the common keys only, with
``nc`` 1 and ``names`` ``{0: "image"}`` (a restoration model has no classes; the keys are kept so
files stay readable by both libraries).
"""
from __future__ import annotations

from torch import nn

from libreyolo.models.registry import register_family
from libreyolo.models.restore import RestoreFamily
from libreyolo.models.swinir.network import SIZES, WINDOW, SwinIR


@register_family
class SwinIRFamily(RestoreFamily):
    name = "swinir"
    sizes = tuple(SIZES)
    default_size = "s"
    stride = WINDOW
    default_imgsz = 64
    filename_pattern = r"LibreSwinIR(?P<size>[sml])"
    # one fixed-shape capture per padded input size (the graph runner keys captures by shape);
    # the masks of a size are built once per device before capture (SwinIRBlock._mask)
    SUPPORTS_CUDA_GRAPH = True
    # peak RSS growth of one eager float32 forward on the CPU, per input pixel, at 128x128 (and
    # 256x256 for s: 13.0 and 13.4 kB): a 3000x3000 image untiled needs ~120 GB on swinir-s
    bytes_per_pixel = {"s": 13_400, "m": 27_500, "l": 30_800}

    def build(self, size: str, nc: int) -> nn.Module:
        return SwinIR(size)  # nc does not apply (restoration)

    def filename(self, size: str) -> str:
        return f"LibreSwinIR{size}"
