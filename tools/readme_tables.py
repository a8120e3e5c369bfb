"""The README's family, task and format tables, generated from the registries.

``python tools/readme_tables.py`` prints them; ``--write`` replaces each table in README.md between its
``<!-- table:NAME -->`` and ``<!-- /table:NAME -->`` markers. ``tests/test_readme_tables.py`` fails when the
README and the registries drift apart (a family, task or format added without the README saying so).
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def family_table() -> str:
    from libreyolo.models.registry import families

    rows = ["| family | task | sizes (input px) | checkpoint names | CUDA graphs |", "|---|---|---|---|---|"]
    for name, fam in sorted(families().items(), key=lambda kv: (kv[1].task, kv[0])):
        if fam.native_resolution:
            sizes = [", ".join(fam.sizes) + " (any input size)"]
        else:
            sizes = [f"{size} ({fam.default_imgsz_for(size)})" for size in fam.sizes]
        graphs = "yes" if fam.SUPPORTS_CUDA_GRAPH else "no"
        checkpoint = f"`{fam.filename(fam.default_size)}.pt`"
        rows.append(f"| `{name}` | {fam.task} | {', '.join(sizes)} | {checkpoint} | {graphs} |")
    return "\n".join(rows)


def task_table() -> str:
    from libreyolo.tasks import tasks

    rows = ["| task | `Results` attribute | predict options | metric |", "|---|---|---|---|"]
    for name, task in tasks().items():
        opts = ", ".join(f"`{k}`" for k in task.options) or "-"
        rows.append(f"| `{name}` | `{task.payload}` | {opts} | {task.metric or '-'} |")
    return "\n".join(rows)


def format_table() -> str:
    from libreyolo.export.base import FORMATS, get_exporter

    rows = ["| format | artifact | runs through | extra | fp16 | INT8 | dynamic batch | NMS inside |",
            "|---|---|---|---|---|---|---|---|"]
    half = {"no": "no", "cuda": "CUDA export", "any": "yes"}
    int8 = {"no": "no", "qdq": "Q/DQ graph", "own": "toolchain"}
    for fmt in FORMATS:
        ex = get_exporter(fmt)
        artifact = f"`*{ex.suffix}`" + (" folder" if ex.is_directory else "")
        rows.append(f"| `{fmt}` | {artifact} | `libreyolo.runtimes.{ex.runtime}` | `{ex.extra}` | "
                    f"{half.get(ex.half, ex.half)} | {int8.get(ex.int8_mode, ex.int8_mode)} | "
                    f"{'yes' if ex.dynamic_shapes else 'no'} | {'yes' if ex.embedded_nms else 'no'} |")
    return "\n".join(rows)


TABLES = {"families": family_table, "tasks": task_table, "formats": format_table}


def _pattern(name: str) -> re.Pattern[str]:
    return re.compile(rf"(<!-- table:{name} -->\n)(.*?)(\n<!-- /table:{name} -->)", re.S)


def current(text: str, name: str) -> str | None:
    """The table ``name`` as the README has it, or None when its markers are missing."""
    m = _pattern(name).search(text)
    return m.group(2) if m else None


def render(text: str) -> str:
    """``text`` with every table regenerated between its markers."""
    for name, make in TABLES.items():
        pat = _pattern(name)
        if not pat.search(text):
            raise SystemExit(f"README.md has no <!-- table:{name} --> ... <!-- /table:{name} --> markers")
        table = make()
        text = pat.sub(lambda m, t=table: m.group(1) + t + m.group(3), text)
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="rewrite the tables in README.md")
    args = ap.parse_args(argv)
    if args.write:
        text = README.read_text()
        new = render(text)
        if new != text:
            README.write_text(new)
        print("README.md tables up to date" if new == text else "README.md tables rewritten")
        return 0
    for name, make in TABLES.items():
        print(f"<!-- table:{name} -->\n{make()}\n<!-- /table:{name} -->\n")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
