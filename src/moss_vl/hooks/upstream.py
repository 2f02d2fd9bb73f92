"""Reading the upstream symbols the hooks patch: resolve a target, tell whether
a hook wraps it, and hash its source.

``wraps(target, func)`` is how the plugin checks, after SGLang's
``HookRegistry.apply_hooks``, that a hook took effect: the registry's wrappers
(``functools.wraps`` + ``__wrapped__``) keep the hook callable in their
closure, so the chain from the installed attribute down to the original is
walked and each wrapper's closure searched for ``func``. Other plugins'
wrappers around the same target do not hide it.

``source_sha256(obj)`` hashes the target's own source with comments,
docstring, blank lines and line wrapping removed (tokens kept, indentation
kept as structure), so reformatting upstream does not count as a change but
any edit to the code does. tests/compat/test_upstream_sources.py compares it
with the hashes recorded in tests/compat/upstream_sources.json.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import io
import pkgutil
import textwrap
import tokenize


def resolve(target: str):
    """The object ``target`` names (``pkg.module.Class.attr``), as HookRegistry resolves it."""
    obj_path, attr = target.rsplit(".", 1)
    return getattr(pkgutil.resolve_name(obj_path), attr)


def installed_attribute(target: str):
    """What ``target`` is bound to now, unwrapping classmethod/staticmethod."""
    obj_path, attr = target.rsplit(".", 1)
    owner = pkgutil.resolve_name(obj_path)
    raw = owner.__dict__.get(attr) if isinstance(owner, type) else None
    if isinstance(raw, (classmethod, staticmethod)):
        return raw.__func__
    return getattr(owner, attr)


def wrapper_chain(obj):
    """``obj`` and every ``__wrapped__`` below it (cycle-safe)."""
    seen = set()
    while obj is not None and id(obj) not in seen:
        seen.add(id(obj))
        yield obj
        obj = getattr(obj, "__wrapped__", None)


def wraps(target: str, func) -> bool:
    """Whether ``func`` is applied to ``target``: it is the bound object (a
    class REPLACE) or sits in the closure of a wrapper on its chain."""
    try:
        current = installed_attribute(target)
    except Exception:  # noqa: BLE001  an unresolvable target is simply not wrapped
        return False
    for obj in wrapper_chain(current):
        if obj is func:
            return True
        for cell in getattr(obj, "__closure__", None) or ():
            try:
                if cell.cell_contents is func:
                    return True
            except ValueError:  # an empty cell
                continue
    return False


def original(target: str):
    """The upstream object under any hook wrappers."""
    return inspect.unwrap(resolve(target))


def normalised_source(obj) -> str:
    """``obj``'s source as tokens: no comments, docstring, blank lines or wrapping."""
    return normalise(inspect.getsource(obj))


def normalise(source: str) -> str:
    """The tokens of one function or class definition, structure kept."""
    source = textwrap.dedent(source)
    docstring_lines: set[int] = set()
    tree = ast.parse(source)
    node = tree.body[0] if tree.body else None
    body = getattr(node, "body", None)
    if (
        body
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    ):
        docstring_lines = set(range(body[0].lineno, body[0].end_lineno + 1))
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.ENCODING, tokenize.ENDMARKER}
    out: list[str] = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type in skip:
            continue
        if tok.start[0] in docstring_lines and tok.type not in (tokenize.INDENT, tokenize.DEDENT):
            continue
        if tok.type == tokenize.NEWLINE:
            out.append("\n")
        elif tok.type == tokenize.INDENT:
            out.append("<indent>")
        elif tok.type == tokenize.DEDENT:
            out.append("<dedent>")
        else:
            out.append(tok.string)
    return " ".join(out)


def source_sha256(obj) -> str:
    return hashlib.sha256(normalised_source(obj).encode()).hexdigest()
