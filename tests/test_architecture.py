"""The structure docs/architecture.md describes, checked on the source (nothing is imported):
one direction between the top-level packages, no import cycles, no private names imported
across modules, an engine that knows nothing of the layers above it, and imports inside
function bodies only where a comment says why."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("app", "gguf_tools", "native")
# who may import whom: app -> gguf_tools -> native
LAYER = {"app": 2, "gguf_tools": 1, "native": 0}
ENGINE_MUST_NOT_IMPORT = ("app.session", "app.ui", "app.cli", "app.bench", "app.hub", "app.documents")
MAX_BODY_IMPORTS = 20


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for p in (ROOT / pkg).rglob("*.py"):
            parts = p.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = p
    return out


MODULES = _modules()


class _Import:
    def __init__(self, module: str, target: str, name: str | None, line: int, in_body: bool, comment: str):
        self.module, self.target, self.name, self.line, self.in_body, self.comment = \
            module, target, name, line, in_body, comment


def _resolve(name: str) -> str | None:
    """The project module an imported dotted name lives in (a module, or an attribute of one)."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def _imports() -> list[_Import]:
    out = []
    for mod, path in MODULES.items():
        text = path.read_text()
        lines = text.splitlines()
        tree = ast.parse(text)
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            in_body = type_checking = False
            up = node
            while up in parents:
                up = parents[up]
                in_body |= isinstance(up, (ast.FunctionDef, ast.AsyncFunctionDef))
                type_checking |= isinstance(up, ast.If) and "TYPE_CHECKING" in ast.unparse(up.test)
            if type_checking:
                continue  # annotations only: not a dependency at run time
            comment = lines[node.lineno - 1].partition("#")[2]
            if isinstance(node, ast.Import):
                pairs = [(a.name, None) for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    pkg = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
                    base = ".".join(pkg[:len(pkg) - node.level + 1] + ([base] if base else []))
                pairs = [(f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base, a.name) for a in node.names]
            for dotted, name in pairs:
                target = _resolve(dotted)
                if target is not None and target != mod:
                    out.append(_Import(mod, target, name, node.lineno, in_body, comment))
    return out


IMPORTS = _imports()


def test_top_level_packages_import_each_other_in_one_direction() -> None:
    wrong = [f"{i.module}:{i.line} imports {i.target}" for i in IMPORTS
             if LAYER[i.target.split(".")[0]] > LAYER[i.module.split(".")[0]]]
    assert not wrong, "app -> gguf_tools -> native only:\n" + "\n".join(wrong)


def test_no_import_cycles() -> None:
    graph: dict[str, set[str]] = {}
    for i in IMPORTS:
        graph.setdefault(i.module, set()).add(i.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(MODULES):
        if v not in index:
            visit(v)
    assert not cycles, cycles


def test_no_private_names_imported_from_other_modules() -> None:
    private = [f"{i.module}:{i.line} imports {i.name} from {i.target}" for i in IMPORTS
               if i.name and i.name.startswith("_") and not i.name.startswith("__")]
    assert not private, private


def test_the_engine_knows_nothing_of_the_layers_above_it() -> None:
    wrong = [f"{i.module}:{i.line} imports {i.target}" for i in IMPORTS
             if i.module.startswith("app.engine") and i.target.startswith(ENGINE_MUST_NOT_IMPORT)]
    assert not wrong, wrong


def test_imports_inside_functions_are_few_and_say_why() -> None:
    body = [i for i in IMPORTS if i.in_body]
    where = {(i.module, i.line) for i in body}
    assert len(where) <= MAX_BODY_IMPORTS, sorted(where)
    silent = sorted(f"{i.module}:{i.line}" for i in body if len(i.comment.strip()) < 12)
    assert not silent, f"imports in function bodies without a reason on their line: {silent}"
