"""Upstream's own words for what changed: the source of every patched symbol
is the one the hook was written against.

Each hook depends on the body it patches, not only on its signature: a
replacement re-implements it, an around hook re-does part of it (the
FlashInfer planner, the native backend's cross-attention branch) or mirrors
its branch order (the Ascend refusals), an after hook reads what it set. So
the normalised source of each installed target (moss_vl.hooks.upstream:
comments, docstrings and line wrapping do not count) is compared with the
hashes recorded in upstream_sources.json for the releases of its line; a
changed body fails here with the hook's name. What to do then:
docs/upgrading-sglang.md (read upstream's change, adapt the hook, then
`hack/upstream-sources.py --record`).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from moss_vl.hooks import all_hooks, sglang_version, upstream
from moss_vl.sglang_versions import nearest_line
from npu_stubs import import_ascend_backend

RECORD = json.loads((Path(__file__).parent / "upstream_sources.json").read_text())
VERSION = sglang_version()
LINE = nearest_line(VERSION)
HOOKS = [h for h in all_hooks() if LINE in h.sglang_versions]


def recorded_for_line(hook) -> dict[str, str]:
    entry = RECORD.get(hook.name, {})
    return {v: h for v, h in entry.get("sha256", {}).items() if v in LINE}


@pytest.mark.parametrize("hook", HOOKS, ids=lambda h: h.name)
def test_upstream_body_is_the_one_the_hook_was_written_against(hook):
    if "ascend_backend" in hook.target:
        import_ascend_backend()
    entry = RECORD.get(hook.name)
    assert entry is not None, (
        f"{hook.name}: no upstream source hash recorded; run hack/upstream-sources.py --record"
    )
    assert entry["target"] == hook.target, f"{hook.name}: recorded for {entry['target']}"
    digest = upstream.source_sha256(upstream.original(hook.target))
    recorded = recorded_for_line(hook)
    assert digest in recorded.values(), (
        f"{hook.name}: upstream {hook.target} changed in SGLang {VERSION} "
        f"(normalised source sha256 {digest[:16]}; the hook was written against "
        f"{ {v: h[:16] for v, h in recorded.items()} or 'nothing in line ' + LINE.name}). "
        "Read upstream's change, adapt the hook, then record it: docs/upgrading-sglang.md"
    )


def test_every_recorded_hook_still_exists():
    names = {h.name for h in all_hooks()}
    assert set(RECORD) <= names, f"recorded but gone: {sorted(set(RECORD) - names)}"


def test_the_hash_ignores_comments_docstrings_and_wrapping_but_not_code():
    base = upstream.normalise("def f(a, b):\n    return g(a, b)\n")
    for same in (
        'def f(a, b):\n    """Sum."""\n    # why\n\n    return g(a,\n             b)\n',
        "    def f(a, b):\n        return g(a, b)\n",
        "def f(a,b):\n  return g( a,b )  # spaced differently\n",
    ):
        assert upstream.normalise(same) == base, same
    assert upstream.normalise("def f(a, b):\n    return g(b, a)\n") != base
    assert upstream.normalise("def f(a, b):\n    if a:\n        x = 1\n    y = 2\n") != (
        upstream.normalise("def f(a, b):\n    if a:\n        x = 1\n        y = 2\n")
    )
