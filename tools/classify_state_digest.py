"""Digest the reference's classifier state dicts (key names, shapes, order) from fixture schemas.

    python tools/classify_state_digest.py <compat dir> [<compat dir> ...] > tests/data/classify_reference_state.json

Each ``fixtures/<family>-<size>*/schema.json`` with task "classify" (written from the reference
library by the shared fixtures or by ``tools/make_reference_fixture.py``) gives one entry
``<family>-<size>``: key count, element count and the sha256 of its ``key:[shape]`` lines, which
``tests/test_compat_classify.py`` compares with the networks built here.
"""
from __future__ import annotations

import hashlib
import json
import math
import sys
from pathlib import Path


def main(folders: list[str]) -> None:
    out: dict[str, dict] = {}
    for folder in folders:
        for schema_file in sorted(Path(folder, "fixtures").glob("*/schema.json")):
            s = json.loads(schema_file.read_text())
            if s["task"] != "classify" or s.get("nc") != 1000:
                continue
            lines = "\n".join(f"{t['key']}:{t['shape']}" for t in s["tensors"])
            out[f"{s['family']}-{s['size']}"] = {
                "keys": len(s["tensors"]), "numel": sum(math.prod(t["shape"]) for t in s["tensors"]),
                "sha256": hashlib.sha256(lines.encode()).hexdigest()}
    json.dump(dict(sorted(out.items())), sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main(sys.argv[1:])
