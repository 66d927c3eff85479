"""The import rules of headlens' layout (docs/architecture.md), read from the source with ``ast``.

Packages follow the data, and imports point one way: a module may import its own package and the
packages before it in :data:`ORDER`, never one after it. ``headlens.errors``, ``headlens.progress`` and
``headlens.testing`` may be imported from anywhere, and the top-level ``headlens`` only for ``__version__``. Every import
counts: top-level, inside functions (lazy) and under ``TYPE_CHECKING``. Module-level cycles are
refused too, inside a package as well as across packages.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

# the pipeline, first to last: each package may import only itself and the ones before it
ORDER = ("zoo", "models", "probes", "readout", "detectors", "scoring", "interventions", "circuits", "atlas", "viz",
         "training", "doctor", "app", "cli")
ANYWHERE = ("headlens.errors", "headlens.progress", "headlens.testing")


@dataclass(frozen=True)
class Import:
    source: str  # importing module, dotted
    target: str  # imported module, dotted (the longest prefix that is a module of the tree)
    where: str  # path:line


def modules(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` under ``root`` (the ``headlens`` package folder)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def imports(root: Path) -> list[Import]:
    """Every import of a headlens module by a headlens module."""
    mods = modules(root)
    found = []
    for name, path in mods.items():
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                if node.level:
                    base = base[: len(base) - node.level + 1]
                    prefix = ".".join(base + ([node.module] if node.module else []))
                else:
                    prefix = node.module or ""
                # `from pkg import sub` imports the submodule when there is one, else a name of pkg
                targets = [f"{prefix}.{a.name}" if f"{prefix}.{a.name}" in mods else
                           (f"{prefix}:{a.name}" if prefix == "headlens" else prefix) for a in node.names]
            else:
                continue
            for t in targets:
                if not t.startswith("headlens"):
                    continue
                if ":" not in t:
                    while t not in mods and "." in t:
                        t = t.rsplit(".", 1)[0]
                if t != name:
                    found.append(Import(name, t, f"{path.relative_to(root.parent)}:{node.lineno}"))
    return found


def _package(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ORDER else None


def direction_errors(root: Path) -> list[str]:
    """One readable line per import that runs against the pipeline."""
    errors = []
    for imp in imports(root):
        if imp.target in ANYWHERE or imp.source in ("headlens", "headlens.__main__"):
            continue
        if imp.target.startswith("headlens:"):
            if imp.target != "headlens:__version__":
                errors.append(f"{imp.where}: imports {imp.target.split(':')[1]!r} from the top-level headlens; "
                              f"import it from the module that defines it (only __version__ comes from there)")
            continue
        if imp.target == "headlens":
            errors.append(f"{imp.where}: `import headlens` inside the library; import the module you need "
                          f"(or `from headlens import __version__`)")
            continue
        src, dst = _package(imp.source), _package(imp.target)
        if dst is None:
            errors.append(f"{imp.where}: imports {imp.target}, which is in no package of the pipeline "
                          f"({', '.join(ORDER)}); move it into one")
        elif src is None:
            if imp.source not in ANYWHERE:
                errors.append(f"{imp.where}: {imp.source} is in no package of the pipeline; move it into one")
        elif ORDER.index(dst) > ORDER.index(src):
            allowed = ", ".join(ORDER[: ORDER.index(src)]) or "nothing but errors"
            errors.append(f"{imp.where}: {imp.source} imports {imp.target}, but {src}/ comes before {dst}/ in the "
                          f"pipeline; {src}/ may import {allowed} (and errors, testing)")
    return errors


def cycles(root: Path) -> list[list[str]]:
    """Module-level import cycles (strongly connected components of more than one module)."""
    graph: dict[str, set[str]] = {m: set() for m in modules(root)}
    for imp in imports(root):
        if imp.target in graph:
            graph[imp.source].add(imp.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out
