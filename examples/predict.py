"""Detect objects in an image with a LibreYOLO checkpoint and save the annotated result.

    python examples/predict.py [CHECKPOINT] [IMAGE] [OUTPUT]

Without a checkpoint it builds the untrained YOLOv9-t (random weights: boxes are meaningless,
the pipeline is real). Without an image it uses the bundled sample image.
"""
from __future__ import annotations

import sys

from libreyolo import SAMPLE_IMAGE, LibreYOLO


def main(argv: list[str]) -> int:
    checkpoint = argv[0] if argv else "LibreYOLO9t.yaml"
    image = argv[1] if len(argv) > 1 and argv[1] else SAMPLE_IMAGE
    output = argv[2] if len(argv) > 2 else "predict_example.jpg"
    model = LibreYOLO(checkpoint)
    result = model(image, conf=0.25)
    for row in result.summary()[:5]:
        print(f"{row['name']:>12} {row['confidence']:.3f} {row['box']}")
    print(f"{len(result)} detections; speed (ms): {result.speed}")
    print("saved", result.save(output))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
