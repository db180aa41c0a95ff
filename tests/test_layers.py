"""The storeys of docs/ARCHITECTURE.md hold in the code: a folder imports only its own
storey and the ones below it, and no modules import each other in a circle.

Every import statement counts, wherever it sits (module level, ``if TYPE_CHECKING:``, or
inside a function), because a deferred import still ties the two modules together.
"""
from __future__ import annotations

import ast
import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("native", "wal", "uploader", "tiered")

#: Longest prefix wins. The numbers are the storeys of docs/ARCHITECTURE.md (the shared
#: helpers at the foot of ``tiered/`` stand on the ground floor with what they import).
STOREYS = {
    "native": 0,
    "wal": 1,
    "tiered.backoff": 1, "tiered.logs": 1, "tiered.metrics": 1, "tiered.timers": 1, "tiered._distribution": 1,
    "tiered.errors": 2, "tiered.metadata": 2, "tiered.objects": 2,
    "tiered.archive": 3,
    "uploader": 4, "tiered.read": 4, "tiered.spark": 4,
    "tiered.lifecycle": 5,
    "tiered.cluster": 6,
    "tiered.broker": 7,
    "tiered.config": 8,
    "tiered.tools": 9,
    "tiered": 9,  # the package face only
}


def storey(module: str) -> int:
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        prefix = ".".join(parts[:n])
        if prefix in STOREYS:
            return STOREYS[prefix]
    raise AssertionError(f"{module} is on no storey: add its folder to STOREYS and to docs/ARCHITECTURE.md")


def modules() -> dict[str, str]:
    """module name -> file path, for every library module (tests excluded)."""
    found = {}
    for package in PACKAGES:
        for dirpath, _dirs, files in os.walk(os.path.join(REPO, package)):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(dirpath, name)
                    module = os.path.relpath(path, REPO)[:-3].replace(os.sep, ".")
                    found[module.removesuffix(".__init__")] = path
    return found


def imports(path: str, known: dict[str, str]) -> set[str]:
    """The library modules ``path`` imports (``from a.b import c`` names ``a.b.c`` when
    that is a module, else ``a.b``)."""
    with open(path) as f:
        tree = ast.parse(f.read())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in known else node.module
                     for alias in node.names]
        else:
            continue
        out.update(name for name in names if name.split(".")[0] in PACKAGES and name in known)
    return out


def graph() -> dict[str, set[str]]:
    known = modules()
    return {module: imports(path, known) - {module} for module, path in known.items()}


def test_no_folder_imports_a_storey_above_its_own() -> None:
    upward = sorted(f"{src} (storey {storey(src)}) imports {dst} (storey {storey(dst)})"
                    for src, dsts in graph().items() for dst in dsts if storey(dst) > storey(src))
    assert not upward, "\n".join(upward)


def test_no_modules_import_each_other_in_a_circle() -> None:
    edges = graph()
    # Package faces (__init__) hand names on from their own submodules; a submodule that
    # imports its package's face for one name is not a circle of code, so faces are left out.
    faces = {m for m, path in modules().items() if path.endswith("__init__.py")}
    edges = {m: {d for d in ds if d not in faces} for m, ds in edges.items() if m not in faces}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    assert not circles, circles
