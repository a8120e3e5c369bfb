"""The restore contract: what an image-restoration (super-resolution) family declares, once.

A restore family subclasses :class:`RestoreFamily`, sets its sizes and file-name pattern and
implements ``build``. Its network takes (B, 3, H, W) RGB in [0, 1] at the image's own size (any
mean is applied inside the network) and returns the restored (B, 3, scale*H, scale*W), not
clamped. Everything else is shared:

- preprocessing: :class:`~libreyolo.ops.pad.PadToMultiple`: no resize; reflect padding at the
  bottom and right to a multiple of :attr:`RestoreFamily.stride` (the window), a mixed-size batch
  to its largest image; ``imgsz`` is not used by predict (an image is restored at its own size),
  only as the fixed input side of an export;
- tiling (predict options ``tile``, ``tile_pad``): :meth:`RestoreFamily.run_network` runs the
  network tile by tile on the padded batch, each tile with ``tile_pad`` pixels of context on each
  side (clipped at the image border), and pastes each output tile's core at ``scale`` times its
  place; no blending;
- postprocessing: :meth:`RestoreFamily.postprocess` crops each output to ``scale`` times its
  image's size, clamps to [0, 1] and rounds to 8 bit -> ``{"image": (scale*h, scale*w, 3) uint8}``;
- export: one output ``image`` (B, 3, scale*S, scale*S), judged as pixels in [0, 1]; decoded
  images are compared by ``libreyolo.comparison.images:match_images``.

Training is not offered (the real-world models need degradation and GAN pipelines).
"""
from __future__ import annotations

from typing import Any, ClassVar

import torch

from libreyolo.models.base import Family
from libreyolo.models.contract import ImageContract, OutputGroup
from libreyolo.ops.pad import PadMeta, PadToMultiple

RESTORE_EXPORT = ImageContract(
    tensor_rank=6,  # SwinIR's window partition (B, H/w, w, W/w, w, C)
    input_name="images",
    image_input=True,  # the 8-bit image / 255: the network subtracts its mean inside
    output_names=("image",),
    # ONNX takes any height and width that are multiples of the window (predict pads to them)
    output_axes={"image": {0: "batch", 2: "out_height", 3: "out_width"}},
    dynamic_batch=True,
    dynamic_spatial=True,
    groups=(OutputGroup("image", "image", axis=1),),
    class_axes={},
)


class RestoreFamily(Family):
    """Base of every image-restoration family (task ``restore``)."""

    task = "restore"
    contract_kind = ImageContract
    export = RESTORE_EXPORT
    scale: ClassVar[int] = 4
    stride = 8           # the side multiple the network needs (its attention window)
    default_imgsz = 64   # the export input side when none is given (the reference's build size)
    nc_key = None
    native_resolution = True  # PadToMultiple: the image keeps its size

    def letterbox(self, imgsz: int) -> PadToMultiple:
        return PadToMultiple(self.stride, size=imgsz)

    def check_imgsz(self, value: Any) -> int:
        """``imgsz`` does not change predict() (each image is restored at its own size); it is the
        input side of an export, so it must be a multiple of the window (``stride``)."""
        return super().check_imgsz(value)

    def request_work(self, height: int, width: int, imgsz: int, opts: Any) -> int:
        """The pixels :meth:`run_network` feeds the network for one image: its own size padded to
        the window, or with ``tile``, every tile with its ``tile_pad`` context (clipped at the
        border), so a small tile with a large context counts what it costs."""
        s = self.stride
        h, w = -(-height // s) * s, -(-width // s) * s
        tile = opts.get("tile")
        if not tile:
            return h * w
        pad = int(opts.get("tile_pad") or 0)

        def spans(n: int) -> int:  # the summed length of the tiles' windows along one side
            return sum(min(t + tile + pad, n) - max(t - pad, 0) for t in range(0, n, tile))

        return spans(h) * spans(w)

    def export_outputs(self, outputs: Any) -> tuple[torch.Tensor, ...]:
        return (outputs["image"] if isinstance(outputs, dict) else outputs,)

    # peak bytes of one eager float32 forward per input pixel, per size (measured; 0: not estimated)
    bytes_per_pixel: ClassVar[dict[str, int]] = {}

    def forward_bytes(self, size: str, shape: tuple[int, ...], opts: Any = None) -> int | None:
        """An image is restored at its own size, so its memory grows with its pixels: untiled, the
        whole padded batch; tiled, one tile with its context at a time."""
        per_pixel = self.bytes_per_pixel.get(size)
        if not per_pixel:
            return None
        b, h, w = int(shape[0]), int(shape[-2]), int(shape[-1])
        tile = opts.get("tile") if opts is not None else None
        if tile:
            side = tile + 2 * int(opts.get("tile_pad") or 0)
            h, w = min(h, side), min(w, side)
        return b * h * w * per_pixel

    def run_network(self, forward: Any, batch: torch.Tensor, opts: Any = None) -> dict[str, torch.Tensor]:
        """The restored batch, whole or tile by tile (``opts.tile``; None: one forward).

        Tiles are ``tile`` x ``tile`` squares of the padded batch from its top left (the last row
        and column of tiles smaller). Each tile is run with ``tile_pad`` pixels of the image around
        it on each side (fewer at the image border, where there is no more image) and only its core,
        ``scale`` times the tile, is kept: each tile's core comes from a forward of the tile plus
        ``tile_pad`` context, with no blending across seams. ``tile`` is a multiple of the window and
        so is ``tile_pad`` by default (32), so every tile's windows coincide with the whole image's;
        a pixel then differs from the untiled output only through context beyond ``tile_pad``
        (tests/test_restore_tiling.py measures how much). Each tile goes through the same
        ``forward`` as a whole image (eager, or an artifact's runtime).
        """
        tile = opts.get("tile") if opts is not None else None
        if not tile:
            return forward(batch)
        if tile % self.stride:
            from libreyolo.errors import ArgumentError

            raise ArgumentError(f"tile must be a multiple of {self.name}'s window {self.stride}, got {tile}")
        pad, s = int(opts.get("tile_pad") or 0), self.scale
        h, w = int(batch.shape[-2]), int(batch.shape[-1])
        canvas = None
        for y0 in range(0, h, tile):
            y1, ya = min(y0 + tile, h), max(y0 - pad, 0)
            yb = min(y1 + pad, h)
            for x0 in range(0, w, tile):
                x1, xa = min(x0 + tile, w), max(x0 - pad, 0)
                xb = min(x1 + pad, w)
                out = self.export_outputs(forward(batch[:, :, ya:yb, xa:xb]))[0]
                if canvas is None:
                    canvas = out.new_empty((out.shape[0], out.shape[1], h * s, w * s))
                core = out[:, :, (y0 - ya) * s:(y1 - ya) * s, (x0 - xa) * s:(x1 - xa) * s]
                canvas[:, :, y0 * s:y1 * s, x0 * s:x1 * s] = core
        return {self.export.output_names[0]: canvas}

    def postprocess(self, outputs: Any, metas: list[PadMeta], opts: Any = None, **kw: Any) -> list[dict]:
        self.task_options(opts, kw)  # checks keyword options (another task's, such as conf, are refused)
        image = self.export_outputs(outputs)[0]
        out = []
        for i, meta in enumerate(metas):
            h, w = meta.orig_shape
            x = image[i, :, :h * self.scale, :w * self.scale].float().clamp(0.0, 1.0)
            out.append({"image": x.mul(255.0).round().to(torch.uint8).permute(1, 2, 0).contiguous()})
        return out
