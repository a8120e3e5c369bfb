"""Drawing detections and top-5 classes with Pillow (no OpenCV dependency)."""
from __future__ import annotations

import colorsys
from typing import TYPE_CHECKING

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
    from PIL import Image, ImageDraw, ImageFont

    image = Image.fromarray(result.orig_rgb()).convert("RGB")
    if result.probs is not None:
        draw_top5(image, result, show_conf=show_conf)
    if result.boxes is None or len(result.boxes) == 0:
        return image
    draw = ImageDraw.Draw(image)
    lw = line_width or max(2, round(sum(image.size) / 2 * 0.003))
    font = ImageFont.load_default()
    b = result.boxes.cpu()
    for (x1, y1, x2, y2), c, k in zip(b.xyxy.tolist(), b.conf.tolist(), b.cls.tolist(), strict=True):
        color = class_color(int(k))
        draw.rectangle([x1, y1, x2, y2], outline=color, width=lw)
        if labels:
            text = result.names.get(int(k), str(int(k))) + (f" {c:.2f}" if show_conf else "")
            left, top, right, bottom = draw.textbbox((0, 0), text, font=font)
            tw, th = right - left, bottom - top
            ty = y1 - th - 4 if y1 - th - 4 >= 0 else y1
            draw.rectangle([x1, ty, x1 + tw + 4, ty + th + 4], fill=color)
            draw.text((x1 + 2, ty + 2 - top), text, fill=(255, 255, 255), font=font)
    return image


def draw_top5(image: Image.Image, result: Results, *, show_conf: bool = True) -> None:
    """Write the five most probable classes (best first) in the top-left corner, in place."""
    from PIL import ImageDraw, ImageFont

    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default()
    probs = result.probs.cpu()
    x = y = max(2, round(min(image.size) * 0.01))
    for k, c in zip(probs.top5, probs.top5conf.tolist(), strict=True):
        text = result.names.get(k, str(k)) + (f" {c:.3f}" if show_conf else "")
        left, top, right, bottom = draw.textbbox((0, 0), text, font=font)
        draw.rectangle([x, y, x + right - left + 4, y + bottom - top + 4], fill=class_color(k))
        draw.text((x + 2, y + 2 - top), text, fill=(255, 255, 255), font=font)
        y += bottom - top + 6
