"""Private names used across packages (``python tools/private_names.py [package dir]``).

A package here is a subpackage of ``libreyolo`` (``engine``, ``export``, ...) or a top-level module
(``api``, ``checkpoint``, ...); ``libreyolo/__init__.py`` is the package ``libreyolo``. A name with one
leading underscore is private to the package that defines it. Read from the source with ``ast``
(nothing is imported), two kinds of use are reported:

- ``import``: ``from libreyolo.<pkg>[.mod] import _name`` (or a private module ``libreyolo.<pkg>._mod``)
  in a module outside ``<pkg>``; relative imports are resolved first.
- ``attribute``: ``obj._name`` (and ``getattr(obj, "_name")``, ``setattr``, ``hasattr``, ``delattr``)
  where ``obj`` is not ``self``, ``cls`` or ``super()``, in a package that defines no ``_name`` itself
  while another package of ``libreyolo`` does (a ``def``/``class``, a module or class assignment, a
  ``self._name =``, an import alias). Types are not inferred: a package that defines a private name of
  its own may still reach the same name on another package's object; names only third-party code
  defines (``torch._inductor``) are not ours to police.

:data:`ALLOWED` lists the few uses that stay, each with its reason. Exit status 1 when any other is
found. ``tests/test_private_names.py`` runs it in CI and shows it fails on planted uses.
"""
from __future__ import annotations

import ast
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

# (using package, or "*" for any, private name): why it stays. Keep this short; prefer a public name.
ALLOWED: dict[tuple[str, str], str] = {
    ("*", "_version"): "the one line that holds the version string: pyproject.toml reads it as "
                       "libreyolo._version.__version__ without importing the package (setuptools attr)",
}

_ATTR_CALLS = ("getattr", "setattr", "hasattr", "delattr")


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


@dataclass(frozen=True)
class Use:
    path: str  # relative to the package's parent
    line: int
    package: str  # the package of the module that uses the name
    kind: str  # "import" or "attribute"
    name: str
    owner: str  # the package(s) that define it

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.kind} {self.name} (private to {self.owner}) used in {self.package}"


def package_of(rel: Path) -> str:
    """The package of a module path relative to the package root (``engine/model.py`` -> ``engine``)."""
    parts = rel.parts
    if len(parts) == 1:
        return "libreyolo" if parts[0] == "__init__.py" else parts[0].removesuffix(".py")
    return parts[0]


_ANALYSED: dict[tuple[Path, str, str], tuple] = {}  # (module, package, source) -> what _analyse found


def _analyse(rel: Path, pkg: str, text: str, top: str) -> tuple[set[str], list, list]:
    """(private names defined, private imports, private attribute uses) of one module's source."""
    key = (rel, top, text)
    if key not in _ANALYSED:
        tree = ast.parse(text, str(rel))
        _ANALYSED[key] = (_definitions(tree), _import_uses(rel, pkg, tree, top), _attribute_uses(tree))
    return _ANALYSED[key]


def _modules(root: Path, plant: dict[str, str]) -> list[tuple[Path, str, tuple]]:
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if "__pycache__" in rel.parts:
            continue
        text = path.read_text(encoding="utf-8") + plant.get(rel.as_posix(), "")
        found.append((rel, package_of(rel), _analyse(rel, package_of(rel), text, root.name)))
    return found


def _is_self(node: ast.AST) -> bool:
    if isinstance(node, ast.Name):
        return node.id in ("self", "cls")
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"


def _definitions(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for t in ast.walk(target):
                    if isinstance(t, ast.Name):
                        names.add(t.id)
                    elif isinstance(t, ast.Attribute) and _is_self(t.value):
                        names.add(t.attr)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update(a.asname for a in node.names if a.asname)
    return {n for n in names if _private(n)}


def _absolute(module: str | None, level: int, rel: Path, top: str) -> str:
    if not level:
        return module or ""
    base = [top, *rel.with_suffix("").parts]
    base = base[:-1]  # the package the module is in (for __init__.py: the package itself)
    base = base[:len(base) - (level - 1)]
    return ".".join([*base, module] if module else base)


def _import_uses(rel: Path, pkg: str, tree: ast.Module, top: str) -> list[tuple[int, str, str]]:
    uses = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            module = _absolute(node.module, node.level, rel, top)
            parts = module.split(".")
            if parts[0] != top:
                continue
            owner = parts[1] if len(parts) > 1 else "libreyolo"
            if owner == pkg:
                continue
            for private in (p for p in parts[1:] if _private(p)):
                uses.append((node.lineno, private, owner))
            for alias in node.names:
                if _private(alias.name):
                    uses.append((node.lineno, alias.name, owner if len(parts) > 1 else alias.name))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == top and len(parts) > 1 and parts[1] != pkg:
                    uses.extend((node.lineno, p, parts[1]) for p in parts[1:] if _private(p))
    return uses


def _attribute_uses(tree: ast.Module) -> list[tuple[int, str]]:
    uses = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr) and not _is_self(node.value):
            uses.append((node.lineno, node.attr))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _ATTR_CALLS
              and len(node.args) >= 2 and not _is_self(node.args[0]) and isinstance(node.args[1], ast.Constant)
              and isinstance(node.args[1].value, str) and _private(node.args[1].value)):
            uses.append((node.lineno, node.args[1].value))
    return uses


def private_uses(root: Path, plant: dict[str, str] | None = None) -> list[Use]:
    """Every use of a private name across packages under ``root`` (the package directory). ``plant``:
    source appended to modules (path relative to ``root`` -> code), as if written there (the tests)."""
    root = Path(root)
    top = root.name
    modules = _modules(root, plant or {})
    defined: dict[str, set[str]] = defaultdict(set)  # package -> private names it defines
    for _rel, pkg, (names, _, _) in modules:
        defined[pkg] |= names
    owners: dict[str, set[str]] = defaultdict(set)
    for pkg, names in defined.items():
        for name in names:
            owners[name].add(pkg)
    found = []
    for rel, pkg, (_, imports, attributes) in modules:
        where = str(Path(top) / rel)
        for line, name, owner in imports:
            found.append(Use(where, line, pkg, "import", name, owner))
        for line, name in attributes:
            if owners.get(name) and pkg not in owners[name]:
                found.append(Use(where, line, pkg, "attribute", name, ",".join(sorted(owners[name]))))
    return sorted(set(found), key=lambda u: (u.path, u.line, u.name))


def violations(root: Path, allowed: dict[tuple[str, str], str] | None = None,
               plant: dict[str, str] | None = None) -> list[Use]:
    """:func:`private_uses` less those in ``allowed`` (default :data:`ALLOWED`)."""
    allowed = ALLOWED if allowed is None else allowed
    return [u for u in private_uses(root, plant) if (u.package, u.name) not in allowed and ("*", u.name) not in allowed]


def main(argv: list[str]) -> int:
    root = Path(argv[0]) if argv else Path(__file__).resolve().parents[1] / "libreyolo"
    found = violations(root)
    for use in found:
        print(use)
    print(f"{len(found)} private name(s) used across packages")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
