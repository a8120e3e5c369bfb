"""The README's family, task and format tables, and docs/formats.md's tables, generated from the registries.

``python tools/readme_tables.py`` prints them; ``--write`` replaces each table in README.md (and in
docs/formats.md) between its ``<!-- table:NAME -->`` and ``<!-- /table:NAME -->`` markers.
``tests/test_readme_tables.py`` fails when the README or the docs and the registries drift apart (a
family, task or format added without the tables saying so). The format tables come from the format
table, ``libreyolo/export/formats.py``.
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
    from libreyolo.export.formats import FORMAT_TABLE

    rows = ["| format | artifact | runs through | extra | fp16 | INT8 | dynamic batch | NMS inside | e2e (uint8 in) |",
            "|---|---|---|---|---|---|---|---|---|"]
    half = {"no": "no", "cuda": "CUDA export", "any": "yes"}
    int8 = {"no": "no", "qdq": "Q/DQ graph", "own": "toolchain"}
    for f in FORMAT_TABLE:
        artifact = f"`*{f.suffix}`" + (" folder" if f.directory else "")
        rows.append(f"| `{f.name}` | {artifact} | `libreyolo.runtimes.{f.runtime}` | `{f.extra}` | "
                    f"{half.get(f.half, f.half)} | {int8.get(f.int8, f.int8)} | "
                    f"{'yes' if f.dynamic_batch else 'no'} | {'yes' if f.embedded_nms else 'no'} | "
                    f"{'yes' if f.e2e_input else 'no'} |")
    return "\n".join(rows)


def format_detail_table() -> str:
    """docs/formats.md: every field of every row, the modules and the format's own options."""
    from libreyolo.export.formats import FORMAT_TABLE

    yes = {True: "yes", False: "no"}
    rows = ["| format | aliases | artifact | exporter | runtime | extra | dynamic batch / size | fp16 | INT8 | "
            "NMS inside | e2e (uint8 in) | max rank | own options | benchmark device |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for f in FORMAT_TABLE:
        artifact = (f"`*{f.suffix}`" if f.suffix else "`<name>`") + (" folder" if f.directory else "")
        if not f.loads_by_suffix:
            artifact += " (loaded by its layout)"
        dyn = f"{yes[f.dynamic_batch]} / {yes[f.dynamic_batch and f.dynamic_spatial]}"
        if f.batch_axis_dynamic:
            dyn += " (batch axis always dynamic)"
        device = "CPU" if f.traced_on_cpu else "the model's"
        rows.append(
            f"| `{f.name}` | {', '.join(f'`{a}`' for a in f.aliases) or '-'} | {artifact} | "
            f"`libreyolo.export.{f.exporter}` | `libreyolo.runtimes.{f.runtime}` | `{f.extra}` | {dyn} | {f.half} | "
            f"{f.int8} | {yes[f.embedded_nms]} | {yes[f.e2e_input]} | {f.max_tensor_rank or '-'} | "
            f"{', '.join(f'`{o}`' for o in f.option_names) or '-'} | {device} |")
    return "\n".join(rows)


TABLES = {"families": family_table, "tasks": task_table, "formats": format_table}
DOCS = ROOT / "docs" / "formats.md"
DOC_TABLES = {"formats-detail": format_detail_table}


def _pattern(name: str) -> re.Pattern[str]:
    return re.compile(rf"(<!-- table:{name} -->\n)(.*?)(\n<!-- /table:{name} -->)", re.S)


def current(text: str, name: str) -> str | None:
    """The table ``name`` as the README has it, or None when its markers are missing."""
    m = _pattern(name).search(text)
    return m.group(2) if m else None


def render(text: str, tables: dict | None = None, where: str = "README.md") -> str:
    """``text`` with every table regenerated between its markers."""
    for name, make in (TABLES if tables is None else tables).items():
        pat = _pattern(name)
        if not pat.search(text):
            raise SystemExit(f"{where} has no <!-- table:{name} --> ... <!-- /table:{name} --> markers")
        table = make()
        text = pat.sub(lambda m, t=table: m.group(1) + t + m.group(3), text)
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="rewrite the tables in README.md and docs/formats.md")
    args = ap.parse_args(argv)
    if args.write:
        for path, tables in ((README, TABLES), (DOCS, DOC_TABLES)):
            text = path.read_text()
            new = render(text, tables, path.name)
            if new != text:
                path.write_text(new)
            print(f"{path.name} tables up to date" if new == text else f"{path.name} tables rewritten")
        return 0
    for name, make in {**TABLES, **DOC_TABLES}.items():
        print(f"<!-- table:{name} -->\n{make()}\n<!-- /table:{name} -->\n")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
