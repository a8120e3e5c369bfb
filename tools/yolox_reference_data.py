"""Record the reference's YOLOX layout and outputs for every size (the data behind tests/test_compat_yolox.py).

Run it with the reference library's interpreter (libreyolo 1.6.0, used as a black box: built,
filled and run, never read), from a folder where the project's own ``libreyolo`` is not importable::

    cd /tmp && /work/refenv/bin/python /work/main/tools/yolox_reference_data.py \
        /work/shared/compat /work/main/tests/data

Writes ``yolox_reference_state.json`` (per size: key count, element count, sha256 of the
``key:[shape]`` lines in state-dict order) and ``yolox_reference_outputs.npz`` (one seeded
0..255 input of 32x64 and, per size, the three level maps of the network filled with the compat
fixtures' rule, ``fill._filled`` in sorted key order from ``torch.Generator().manual_seed(5)``).
"""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import torch

SIZES = "ntsmlx"
WEIGHT_SEED = 5
INPUT_SEED = 2024


def main(compat: str, out_dir: str) -> None:
    sys.path.insert(0, compat)
    import fill

    from libreyolo import LibreYOLOX

    out: dict[str, np.ndarray] = {}
    digest: dict[str, dict] = {}
    x = torch.rand(1, 3, 32, 64, generator=torch.Generator().manual_seed(INPUT_SEED)) * 255
    out["input"] = x.numpy()
    for size in SIZES:
        net = LibreYOLOX(size=size, device="cpu").model.eval()
        sd = net.state_dict()
        lines = "\n".join(f"{k}:{list(v.shape)}" for k, v in sd.items())
        digest[size] = {"keys": len(sd), "numel": sum(v.numel() for v in sd.values()),
                        "sha256": hashlib.sha256(lines.encode()).hexdigest()}
        g = torch.Generator().manual_seed(WEIGHT_SEED)
        filled = {k: v.clone() if k.endswith("num_batches_tracked") else fill._filled(k, list(v.shape), g).to(v.dtype)
                  for k, v in sorted(sd.items())}
        net.load_state_dict(filled)
        with torch.no_grad():
            for i, level in enumerate(net(x)):
                out[f"{size}.{i}"] = level.numpy()
    np.savez_compressed(Path(out_dir) / "yolox_reference_outputs.npz", **out)
    (Path(out_dir) / "yolox_reference_state.json").write_text(json.dumps(digest, indent=1) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:3])
