"""Grammars a reply must follow: JSON (any object, or what a JSON schema allows) as GBNF, and the
limits a GBNF text must keep before llama.cpp parses it (app.engine.llama_objects.LlamaGrammar
enforces it while sampling).

The JSON-schema converter is llama-cpp-python's (llama_cpp/llama_grammar.py, a port of the pinned
tree's json-schema-to-grammar). It is loaded from its file, not through `import llama_cpp`: that
would load the llama.cpp library into whichever process checks a request (the app's UI process
serves HTTP and runs no model). It is pure Python.
"""

from __future__ import annotations

import importlib.util
import json
from functools import cache
from types import ModuleType

from app.engine.params import InvalidParams

# llama.cpp parses GBNF recursively (nested groups) and walks rule chains recursively: a hostile
# grammar could exhaust the C stack, which no error handler survives
MAX_GRAMMAR_BYTES = 64 << 10
MAX_GRAMMAR_NESTING = 64


def json_grammar(schema: dict | None, field: str) -> str:
    """GBNF for a JSON object (no schema, or an empty one) or for what `schema` allows; an
    InvalidParams naming `field` when it cannot be converted."""
    mod = _converter()
    if not schema:
        return mod.JSON_GBNF
    _local_refs_only(schema, field)
    try:
        gbnf = mod.json_schema_to_gbnf(json.dumps(schema))
    except RecursionError:
        raise InvalidParams(f"{field}: the schema nests too deeply", field) from None
    except Exception as e:  # the converter reports what it cannot convert with asserts and ValueErrors
        raise InvalidParams(f"{field}: cannot be turned into a grammar: {str(e)[:200] or type(e).__name__}",
                            field) from None
    check_grammar(gbnf, field)
    return gbnf


def wrapped_json_grammar(schema: dict, field: str, before: str, after: str, repeat: bool,
                         prop_order: tuple[str, ...] = ()) -> str:
    """GBNF for `before`, a JSON value `schema` allows, then `after` (with `repeat`: one or more of
    these, a newline apart): a tool call in its chat format's markup. `prop_order` puts those
    properties first, in that order. InvalidParams naming `field` when it cannot be converted."""
    mod = _converter()
    _local_refs_only(schema, field)
    try:
        conv = mod.SchemaConverter(prop_order={k: i for i, k in enumerate(prop_order)}, allow_fetch=False,
                                   dotall=False, raw_pattern=False)
        value = conv.visit(conv.resolve_refs(schema, "stdin"), "wrapped")
        one = f"{_literal(before)} {value} {_literal(after)}"
        root = f'{one} ("\\n" {one})*' if repeat else one
        gbnf = f"{conv.format_grammar().rstrip()}\nroot ::= {root}\n"
    except RecursionError:
        raise InvalidParams(f"{field}: the schema nests too deeply", field) from None
    except Exception as e:  # as in json_grammar
        raise InvalidParams(f"{field}: cannot be turned into a grammar: {str(e)[:200] or type(e).__name__}",
                            field) from None
    check_grammar(gbnf, field)
    return gbnf


def _literal(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def check_grammar(gbnf: str, field: str = "grammar") -> None:
    """InvalidParams unless the GBNF text is small and shallow enough for llama.cpp's parser."""
    if len(gbnf.encode()) > MAX_GRAMMAR_BYTES:
        raise InvalidParams(f"{field}: the grammar is larger than {MAX_GRAMMAR_BYTES} bytes", field)
    if _nesting(gbnf) > MAX_GRAMMAR_NESTING:
        raise InvalidParams(f"{field}: the grammar nests groups deeper than {MAX_GRAMMAR_NESTING}", field)


def _nesting(gbnf: str) -> int:
    """The deepest ( ) nesting outside literals, character classes and comments."""
    deepest = level = 0
    i, n = 0, len(gbnf)
    while i < n:
        c = gbnf[i]
        if c in "\"[":  # a literal or a class: skip to its unescaped end
            end = "\"" if c == "\"" else "]"
            i += 1
            while i < n and gbnf[i] != end:
                i += 2 if gbnf[i] == "\\" else 1
        elif c == "#":
            while i < n and gbnf[i] != "\n":
                i += 1
        elif c == "(":
            level += 1
            deepest = max(deepest, level)
        elif c == ")":
            level -= 1
        i += 1
    return deepest


def _local_refs_only(schema: object, field: str) -> None:
    """The converter would fetch an https:// $ref (guarded only by an assert): only "#/..." refs."""
    todo = [schema]
    while todo:
        v = todo.pop()
        if isinstance(v, dict):
            ref = v.get("$ref")
            if ref is not None and not (isinstance(ref, str) and ref.startswith("#")):
                raise InvalidParams(f"{field}: only local $ref (\"#/...\") is supported, got {str(ref)[:80]!r}", field)
            todo.extend(v.values())
        elif isinstance(v, list):
            todo.extend(v)


@cache
def _converter() -> ModuleType:
    spec = importlib.util.find_spec("llama_cpp")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise InvalidParams("JSON output needs llama-cpp-python's grammar converter, which is not installed")
    path = f"{list(spec.submodule_search_locations)[0]}/llama_grammar.py"
    mod_spec = importlib.util.spec_from_file_location("flashdesk_llama_grammar", path)
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    return mod
