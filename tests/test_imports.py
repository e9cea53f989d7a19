"""The package's import graph: no cycles, and no package import hidden inside a function to dodge one.

    python -m pytest tests/test_imports.py -q
"""

from __future__ import annotations

import ast
from pathlib import Path

import hf_dynaspec

PACKAGE = Path(hf_dynaspec.__file__).resolve().parent


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(node: ast.ImportFrom | ast.Import, module: str, is_package: bool) -> list[str]:
    """Package modules an import statement names (relative imports resolved)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.startswith("hf_dynaspec")]
    if node.level == 0:
        base = node.module or ""
    else:
        anchor = module.split(".")[: len(module.split(".")) - node.level + int(is_package)]
        base = ".".join(anchor + ([node.module] if node.module else []))
    if not base.startswith("hf_dynaspec"):
        return []
    names = [f"{base}.{a.name}" for a in node.names]
    return [n for n in names if n in MODULES] or [base]


MODULES = {module_name(p) for p in PACKAGE.rglob("*.py")}


def import_graph() -> tuple[dict[str, set[str]], list[str]]:
    """Module-level edges (imports under `if TYPE_CHECKING:` excluded) and function-level package imports."""
    edges: dict[str, set[str]] = {m: set() for m in MODULES}
    hidden = []
    for path in PACKAGE.rglob("*.py"):
        module = module_name(path)
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges[module].update(imported(node, module, path.name == "__init__.py"))
        for func in ast.walk(tree):
            if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(func):
                    if isinstance(node, (ast.Import, ast.ImportFrom)) and imported(node, module, path.name == "__init__.py"):
                        hidden.append(f"{module}.{func.name}")
    return edges, hidden


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_graph_is_read():
    edges, _ = import_graph()
    assert "hf_dynaspec.masks" in edges["hf_dynaspec.generation.verification.verifier"]
    assert "hf_dynaspec.generation_config" in edges["hf_dynaspec.modeling"]
    assert find_cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]  # the detector finds a planted cycle


def test_no_import_cycle():
    edges, _ = import_graph()
    assert find_cycle(edges) is None


def test_no_package_import_inside_functions():
    _, hidden = import_graph()
    assert hidden == []


def reachable(edges: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in edges.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_the_drafter_does_not_depend_on_decoding():
    """Layers: the drafter (modeling and what it reads) below, the decoding loop (generation/) on top of it."""
    edges, _ = import_graph()
    for module in ("hf_dynaspec.modeling", "hf_dynaspec.head", "hf_dynaspec.generation_config"):
        above = sorted(m for m in reachable(edges, module)
                       if m == "hf_dynaspec.generation" or m.startswith("hf_dynaspec.generation."))
        assert above == [], f"{module} imports {above}"
