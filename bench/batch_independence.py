"""Does one image's result depend on the other images of its batch? (CUDA, per batch size)

    PYTHONPATH=. python3 bench/batch_independence.py --model <checkpoint> \
        --json bench/results/<date>-batch-independence-h200.json

For each batch size and precision: image 0's result in a batch of copies of it against image 0's
result in a batch of distinct frames (the same size) where it stands first, in the middle and
last, through ``predict()`` eagerly and graphed.
``equal``: boxes, scores and classes bit for bit; ``max diff``: the largest box-coordinate
difference where the counts agree. A difference means a kernel (cuDNN's choice for that batch
size) computes an image's outputs differently depending on its neighbours.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from serve_bench import frames  # noqa: E402

from libreyolo import LibreYOLO  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="LibreYOLO9t.yaml")
    ap.add_argument("--sizes", default="2,3,4,6,8,12,16,20,24,28,32")
    ap.add_argument("--json", required=True)
    args = ap.parse_args(argv)
    model = LibreYOLO(args.model, device="cuda")
    pool = frames(32)
    rows = []
    print(f"{'prec':<5} {'graph':<5} {'batch':>5} {'pos':>4} {'equal':>5} {'max diff':>9}")
    for half in (False, True):
        for graph in (False, True):
            for s in (int(v) for v in args.sizes.split(",")):
                kw = {"half": half, "cuda_graph": graph, "conf": 0.25, "workers": 0, "batch": s}
                copies = model.predict([pool[0]] * s, **kw)[0].boxes
                for pos in sorted({0, s // 2, s - 1}):
                    batch = pool[1:s]
                    batch.insert(pos, pool[0])
                    mixed = model.predict(batch, **kw)[pos].boxes
                    equal = all(torch.equal(getattr(copies, k), getattr(mixed, k)) for k in ("xyxy", "conf", "cls"))
                    same_n = copies.xyxy.shape == mixed.xyxy.shape
                    diff = (float((copies.xyxy - mixed.xyxy).abs().max()) if same_n and copies.xyxy.numel()
                            else (0.0 if same_n else None))
                    rows.append({"half": half, "graph": graph, "batch": s, "position": pos, "equal": equal,
                                 "max_diff": diff})
                    print(f"{'fp16' if half else 'fp32':<5} {str(graph):<5} {s:>5} {pos:>4} {str(equal):>5} "
                          f"{diff!s:>9}", flush=True)
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"command": " ".join([sys.executable, *sys.argv]), "gpu": torch.cuda.get_device_name(0),
                               "torch": torch.__version__, "model": args.model, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
