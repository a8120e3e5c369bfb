"""Drawing detections, top-5 classes and class-map legends with Pillow (no OpenCV dependency)."""
from __future__ import annotations

import colorsys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from PIL import Image

    from libreyolo.results import Results


def class_color(k: int) -> tuple[int, int, int]:
    """A stable, well-spread colour per class id (golden-ratio hue steps)."""
    h = (k * 0.618033988749895) % 1.0
    r, g, b = colorsys.hsv_to_rgb(h, 0.75, 0.95)
    return int(r * 255), int(g * 255), int(b * 255)


def draw_detections(result: Results, *, line_width: int | None = None, labels: bool = True,
                    show_conf: bool = True) -> Image.Image:
    """``result.plot()``: every payload of the result drawn on its source image."""
    return result.plot(line_width=line_width, labels=labels, conf=show_conf)


def draw_boxes(image: Image.Image, boxes: Any, names: dict[int, str], *, line_width: int | None = None,
               labels: bool = True, show_conf: bool = True) -> None:
    """Draw detection boxes with class labels on ``image``, in place."""
    from PIL import ImageDraw, ImageFont

    if len(boxes) == 0:
        return
    draw = ImageDraw.Draw(image)
    lw = line_width or max(2, round(sum(image.size) / 2 * 0.003))
    font = ImageFont.load_default()
    b = boxes.cpu()
    ids = [None] * len(b) if getattr(b, "id", None) is None else b.id.tolist()
    for (x1, y1, x2, y2), c, k, i in zip(b.xyxy.tolist(), b.conf.tolist(), b.cls.tolist(), ids, strict=True):
        color = class_color(int(k))
        draw.rectangle([x1, y1, x2, y2], outline=color, width=lw)
        if labels:
            text = ("" if i is None else f"id:{int(i)} ") + names.get(int(k), str(int(k))) + \
                (f" {c:.2f}" if show_conf else "")
            left, top, right, bottom = draw.textbbox((0, 0), text, font=font)
            tw, th = right - left, bottom - top
            ty = y1 - th - 4 if y1 - th - 4 >= 0 else y1
            draw.rectangle([x1, ty, x1 + tw + 4, ty + th + 4], fill=color)
            draw.text((x1 + 2, ty + 2 - top), text, fill=(255, 255, 255), font=font)


def draw_top5(image: Image.Image, probs: Any, names: dict[int, str], *, show_conf: bool = True) -> None:
    """Write the five most probable classes (best first) in the top-left corner, in place."""
    from PIL import ImageDraw, ImageFont

    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default()
    probs = probs.cpu()
    x = y = max(2, round(min(image.size) * 0.01))
    for k, c in zip(probs.top5, probs.top5conf.tolist(), strict=True):
        text = names.get(k, str(k)) + (f" {c:.3f}" if show_conf else "")
        left, top, right, bottom = draw.textbbox((0, 0), text, font=font)
        draw.rectangle([x, y, x + right - left + 4, y + bottom - top + 4], fill=class_color(k))
        draw.text((x + 2, y + 2 - top), text, fill=(255, 255, 255), font=font)
        y += bottom - top + 6


def draw_legend(image: Image.Image, entries: list[tuple[str, tuple[int, int, int]]]) -> None:
    """A colour legend (swatch and label per entry) in the top-left corner, in place."""
    from PIL import ImageDraw, ImageFont

    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default()
    x = y = max(2, round(min(image.size) * 0.01))
    for text, color in entries:
        left, top, right, bottom = draw.textbbox((0, 0), text, font=font)
        th = bottom - top
        draw.rectangle([x, y, x + th + 4, y + th + 4], fill=color, outline=(255, 255, 255))
        draw.rectangle([x + th + 6, y, x + th + 10 + right - left, y + th + 4], fill=(0, 0, 0))
        draw.text((x + th + 8, y + 2 - top), text, fill=(255, 255, 255), font=font)
        y += th + 6
