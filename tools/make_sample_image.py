"""Draw libreyolo/assets/sample.jpg: a synthetic street scene made from shapes (no photograph).

Run: python tools/make_sample_image.py. The output is deterministic; see assets/SAMPLE_IMAGE.md.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

W, H = 640, 480


def main() -> None:
    rs = np.random.RandomState(7)
    y = np.linspace(0, 1, H)[:, None, None]
    sky = np.array([120, 170, 230]) * (1 - y) + np.array([200, 220, 240]) * y
    img = np.broadcast_to(sky, (H, W, 3)).copy()
    img[300:] = np.array([90, 90, 95]) + rs.randn(H - 300, W, 1) * 6  # asphalt
    im = Image.fromarray(np.clip(img, 0, 255).astype(np.uint8))
    d = ImageDraw.Draw(im)
    d.rectangle([0, 290, W, 300], fill=(170, 170, 165))  # kerb
    for x0, h, col in ((20, 170, (150, 110, 90)), (180, 210, (120, 120, 140)), (420, 190, (160, 140, 110))):
        d.rectangle([x0, 290 - h, x0 + 150, 290], fill=col)  # buildings
        for wx in range(x0 + 15, x0 + 140, 35):
            for wy in range(300 - h, 280, 40):
                d.rectangle([wx, wy, wx + 18, wy + 22], fill=(60, 80, 110))
    # a car
    d.rounded_rectangle([250, 330, 470, 400], radius=18, fill=(200, 30, 40))
    d.polygon([(290, 330), (320, 295), (410, 295), (440, 330)], fill=(190, 25, 35))
    d.polygon([(300, 328), (325, 300), (360, 300), (360, 328)], fill=(170, 200, 230))
    d.polygon([(368, 328), (368, 300), (405, 300), (428, 328)], fill=(170, 200, 230))
    for cx in (300, 420):
        d.ellipse([cx - 24, 380, cx + 24, 428], fill=(25, 25, 25))
        d.ellipse([cx - 10, 394, cx + 10, 414], fill=(160, 160, 160))
    # a person
    d.ellipse([545, 250, 575, 282], fill=(230, 190, 160))
    d.rounded_rectangle([538, 282, 582, 360], radius=10, fill=(40, 90, 170))
    d.rectangle([542, 360, 558, 430], fill=(40, 40, 60))
    d.rectangle([562, 360, 578, 430], fill=(40, 40, 60))
    # a traffic light
    d.rectangle([120, 180, 128, 330], fill=(60, 60, 60))
    d.rectangle([108, 140, 140, 200], fill=(30, 30, 30))
    for i, c in enumerate(((220, 40, 40), (90, 70, 20), (40, 90, 40))):
        d.ellipse([115, 144 + i * 18, 133, 160 + i * 18], fill=c)
    im = im.filter(ImageFilter.GaussianBlur(0.6))
    out = Path(__file__).resolve().parents[1] / "libreyolo" / "assets" / "sample.jpg"
    im.save(out, quality=92)
    print(out)


if __name__ == "__main__":
    main()
