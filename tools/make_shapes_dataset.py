"""Write the synthetic shapes dataset (libreyolo.train.shapes) and print where it went.

    python tools/make_shapes_dataset.py /tmp/shapes --n-train 64 --n-val 16 --imgsz 320
    python tools/make_shapes_dataset.py /tmp/shapes-cls --task classify
"""
from __future__ import annotations

import argparse

from libreyolo.train.shapes import make_shapes_dataset


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Write a synthetic coloured-shapes dataset (YOLO or image-folder).")
    parser.add_argument("root", help="folder to write the dataset into (created if missing)")
    parser.add_argument("--n-train", type=int, default=64, help="training images (default 64)")
    parser.add_argument("--n-val", type=int, default=16, help="validation images (default 16)")
    parser.add_argument("--imgsz", type=int, default=320, help="long side of each image in pixels (default 320)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--task", choices=("detect", "classify"), default="detect",
                        help="detect: YOLO layout with data.yaml; classify: train/<class>/ folders")
    args = parser.parse_args(argv)
    out = make_shapes_dataset(args.root, n_train=args.n_train, n_val=args.n_val, imgsz=args.imgsz,
                              seed=args.seed, task=args.task)
    print(out)


if __name__ == "__main__":
    main()
