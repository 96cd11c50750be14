"""The structure docs/architecture.md describes, checked on the source (nothing is imported):
one direction between the top-level packages, no import cycles, no private names imported
across modules, an engine that knows nothing of the layers above it, and imports inside
function bodies (the project's, the standard library's, third parties') only where a comment says
why."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("app", "gguf_tools", "native")
# who may import whom: app -> gguf_tools -> native
LAYER = {"app": 2, "gguf_tools": 1, "native": 0}
# the engine is the lowest layer of app/: every other package of app/ is above it (chat, session, store,
# documents, scheduler, hub, distill, bench, server, cli, host, ui); app.errors is the errors all share
ENGINE_MAY_IMPORT = ("app.engine", "app.errors", "gguf_tools", "native")
# imports in function bodies, each with its reason; a new one raises this on purpose
MAX_BODY_IMPORTS = 43


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for p in (ROOT / pkg).rglob("*.py"):
            parts = p.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = p
    return out


MODULES = _modules()


def _run_time_imports(tree: ast.AST) -> list[tuple[ast.Import | ast.ImportFrom, bool]]:
    """The import statements and whether each is in a function body; those under `if TYPE_CHECKING:`
    are left out (annotations only: not a dependency at run time)."""
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        in_body = type_checking = False
        up = node
        while up in parents:
            up = parents[up]
            in_body |= isinstance(up, (ast.FunctionDef, ast.AsyncFunctionDef))
            type_checking |= isinstance(up, ast.If) and "TYPE_CHECKING" in ast.unparse(up.test)
        if not type_checking:
            out.append((node, in_body))
    return out


class _Import:
    def __init__(self, module: str, target: str, name: str | None, line: int):
        self.module, self.target, self.name, self.line = module, target, name, line


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
        for node, _ in _run_time_imports(ast.parse(path.read_text())):
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
                    out.append(_Import(mod, target, name, node.lineno))
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


def _below_the_engine(target: str) -> bool:
    return any(target == m or target.startswith(m + ".") for m in ENGINE_MAY_IMPORT)


def test_the_engine_knows_nothing_of_the_layers_above_it() -> None:
    wrong = [f"{i.module}:{i.line} imports {i.target}" for i in IMPORTS
             if i.module.startswith("app.engine") and not _below_the_engine(i.target)]
    assert not wrong, wrong


def _reason(lines: list[str], line: int) -> str:
    """The comment that says why an import is where it is: on its line (a `noqa: CODE` is no reason),
    or the comment lines right above it or above the run of import lines it closes."""
    own = re.sub(r"noqa(:\s*[A-Z]+[0-9]+(\s*,\s*[A-Z]+[0-9]+)*)?", "", lines[line - 1].partition("#")[2])
    above = []
    i = line - 2
    while i >= 0 and lines[i].strip().startswith(("import ", "from ")):
        i -= 1
    while i >= 0 and lines[i].strip().startswith("#"):
        above.append(lines[i].strip().lstrip("#"))
        i -= 1
    return " ".join([own, *reversed(above)]).strip(" -:;,.")


def body_imports_without_a_reason() -> tuple[list[str], list[str]]:
    """Every import in a function body in the three packages, and those without a reason (fewer
    than four words: "nvidia-ml-py" names a package, it does not say why the import waits)."""
    every, silent = [], []
    for mod, path in MODULES.items():
        text = path.read_text()
        lines = text.splitlines()
        for node in (n for n, in_body in _run_time_imports(ast.parse(text)) if in_body):
            where = f"{mod}:{node.lineno}"
            every.append(where)
            if len(_reason(lines, node.lineno).split()) < 4:
                silent.append(f"{where}: {lines[node.lineno - 1].strip()}")
    return every, silent


def test_imports_inside_functions_are_few_and_say_why() -> None:
    every, silent = body_imports_without_a_reason()
    assert len(every) <= MAX_BODY_IMPORTS, sorted(every)
    assert not silent, "imports in function bodies without a reason:\n" + "\n".join(sorted(silent))


def test_a_bare_noqa_or_a_package_name_is_no_reason() -> None:
    lines = ["def f():",
             "    import a  # noqa: PLC0415",
             "    import b  # nvidia-ml-py",
             "    import c  # noqa: PLC0415 - Qt only with a display",
             "    # torch takes seconds to import: only this command needs it",
             "    import d",
             "    import e"]
    assert [len(_reason(lines, n).split()) >= 4 for n in (2, 3, 4, 6, 7)] == [False, False, True, True, True]
