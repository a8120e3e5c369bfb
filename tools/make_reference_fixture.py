"""Write a compat fixture folder for a size/seed the shared fixtures do not cover, from the reference library.

Run it with the reference library's interpreter (libreyolo 1.6.0, used as a black box: it is built,
filled and run, never read), from a folder where the project's own ``libreyolo`` is not importable::

    cd /tmp && /work/refenv/bin/python /work/main/tools/make_reference_fixture.py \
        --family swin --size s --seed 1 --compat /work/shared/compat --out /tmp/compat-extra

It writes ``<out>/fixtures/<family>-<size>[-seed<seed>]/`` in the format of ``../shared/compat`` (schema.json,
buffers.npz, meta.json, probes.npz, predict.npz) and copies ``fill.py`` and ``fixtures/sample.png`` next to it,
so the project's compat tests run against it with ``LIBREYOLO_COMPAT_DIR=<out>``. ``--extra-sizes 160,256x224``
also records the network's output on uniform inputs of those sizes (``output.extra.<H>x<W>``; seeded by
``--seed``), which the shared fixtures do not have. Only plain-tensor and dict-of-tensor outputs are handled.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import torch


def _reference_class(family: str):
    import libreyolo

    if Path(libreyolo.__file__).resolve().parents[1].name != "site-packages":
        sys.exit(f"libreyolo resolves to {libreyolo.__file__}, not the reference install; run from another folder")
    for name in dir(libreyolo):
        if not name.startswith("Libre"):
            continue
        try:
            obj = getattr(libreyolo, name)  # lazy attributes import optional extras
        except Exception:
            continue
        if isinstance(obj, type) and getattr(obj, "FAMILY", None) == family:
            return obj
    sys.exit(f"the reference library has no class with FAMILY == {family!r}")


def _flatten(prefix: str, out, into: dict) -> None:
    if isinstance(out, torch.Tensor):
        into[prefix] = out.detach().float().numpy()
    elif isinstance(out, dict):
        for k, v in out.items():
            _flatten(f"{prefix}.{k}", v, into)
    elif isinstance(out, (list, tuple)):
        for i, v in enumerate(out):
            _flatten(f"{prefix}.{i}", v, into)
    else:
        raise SystemExit(f"cannot record output of type {type(out).__name__} at {prefix}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", required=True)
    ap.add_argument("--size", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--compat", required=True, help="the shared compat folder (for fill.py and sample.png)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--extra-sizes", default="", help="comma-separated input sizes, N or HxW")
    args = ap.parse_args()

    compat = Path(args.compat)
    sys.path.insert(0, str(compat))
    import fill as fillmod

    cls = _reference_class(args.family)
    wrapper = cls(size=args.size, device="cpu")
    net = wrapper.model.eval()
    sd = net.state_dict()
    name = f"{args.family}-{args.size}" + (f"-seed{args.seed}" if args.seed else "")
    out = Path(args.out)
    d = out / "fixtures" / name
    d.mkdir(parents=True, exist_ok=True)
    shutil.copy(compat / "fill.py", out / "fill.py")
    shutil.copy(compat / "fixtures" / "sample.png", out / "fixtures" / "sample.png")
    params = {k for k, _ in net.named_parameters()}
    imgsz = int(getattr(wrapper, "input_size", 224))
    schema = {
        "family": args.family, "size": args.size, "task": wrapper.task, "seed": args.seed, "input_size": imgsz,
        "nc": int(wrapper.nb_classes), "reference": "libreyolo 1.6.0 (PyPI), eval mode, float32, CPU",
        "tensors": [{"key": k, "shape": list(v.shape), "dtype": str(v.dtype).replace("torch.", ""),
                     "kind": "param" if k in params else "buffer"} for k, v in sd.items()],
        "probe_size": imgsz,
    }
    (d / "schema.json").write_text(json.dumps(schema, indent=1))
    np.savez(d / "buffers.npz", **{k: v.numpy() for k, v in sd.items() if k not in params})
    filled = fillmod.fill(d)
    net.load_state_dict(filled, strict=True)

    recorded: dict[str, np.ndarray] = {}
    with torch.no_grad():
        for probe, x in fillmod.probes(imgsz, args.seed).items():
            _flatten(f"output.{probe}", net(x), recorded)
        g = torch.Generator().manual_seed(args.seed + 2000)
        for spec in filter(None, args.extra_sizes.split(",")):
            h, _, w = spec.partition("x")
            h, w = int(h), int(w or h)
            _flatten(f"output.extra.{h}x{w}", net(torch.rand(1, 3, h, w, generator=g)), recorded)
    np.savez(d / "probes.npz", **recorded)

    meta = {"schema_version": "1.0", "libreyolo_version": "1.6.0", "model_family": args.family,
            "size": args.size, "task": wrapper.task, "nc": int(wrapper.nb_classes),
            "names": {str(k): v for k, v in dict(wrapper.names).items()}, "imgsz": imgsz}
    (d / "meta.json").write_text(json.dumps(meta, indent=1))

    r = wrapper.predict(str(out / "fixtures" / "sample.png"))
    r = r[0] if isinstance(r, list) else r
    if getattr(r, "probs", None) is not None:
        np.savez(d / "predict.npz", top5=np.asarray(r.probs.top5, dtype=np.int64),
                 top5conf=np.asarray(r.probs.top5conf, dtype=np.float32), call=np.asarray("predict('sample.png')"))
    print(f"wrote {d}")


if __name__ == "__main__":
    main()
