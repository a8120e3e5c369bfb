"""Import circles in a package, module by module (``python tools/import_cycles.py [package]``).

Builds the import graph with grimp (the engine of import-linter; imports under ``TYPE_CHECKING`` left
out, function-level imports counted: a circle hidden inside a function is still a circle) and prints
each strongly connected component of more than one module. Exit status 1 when there is one.
``tests/test_import_layers.py`` runs it in CI, next to the layer contracts in ``pyproject.toml``.
"""
from __future__ import annotations

import sys


def import_cycles(package: str = "libreyolo") -> list[list[str]]:
    """The import circles of ``package``: each a sorted list of the modules that import each other."""
    import grimp

    graph = grimp.build_graph(package, include_external_packages=False, exclude_type_checking_imports=True,
                              cache_dir=None)
    return components(graph.modules, graph.find_modules_directly_imported_by)


def components(nodes, edges) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in sorted(nodes):
        if root in index:
            continue
        work = [(root, iter(sorted(edges(root))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges(child)))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    comp.append(member)
                    if member == node:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return sorted(found)


def main(argv: list[str]) -> int:
    package = argv[0] if argv else "libreyolo"
    cycles = import_cycles(package)
    for comp in cycles:
        print(f"import circle of {len(comp)} modules: {' <-> '.join(comp)}")
    print(f"{len(cycles)} import circle(s) in {package}")
    return 1 if cycles else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
