"""The plugin as SGLang loads it.

Contract: the installed ``sglang.srt.plugins`` entry point is discovered by
``load_plugins()``; ``register()`` is idempotent; next to an unsupported
SGLang it logs one line and registers nothing; hooks whose platform modules
are absent (torch_npu) are left out, and ``MOSS_VL_DISABLE_HOOKS`` leaves out
named hooks.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

from moss_vl import plugin
from moss_vl.hooks import all_hooks


def run(code, **env):
    import os

    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=dict(os.environ, **env),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout + result.stderr


def test_entry_point_is_discovered_and_hooks_applied():
    out = run(
        """
        import logging; logging.basicConfig(level=logging.INFO)
        from sglang.srt.plugins import load_plugins
        from sglang.srt.plugins.hook_registry import HookRegistry
        load_plugins(); load_plugins()
        from sglang.srt.models.moss_vl import MossVLForConditionalGeneration as M
        import moss_vl.hooks.patch_moss_vl as p
        assert M._build_cross_attention_custom_mask.__wrapped__ is not None
        print("PATCHED", sorted(HookRegistry._patched))
        """,
        SGLANG_PLUGINS="moss_vl",
    )
    assert "Loaded plugin moss_vl from group sglang.srt.plugins" in out
    from moss_vl.hooks import sglang_version

    version = sglang_version()
    expected = len([h for h in all_hooks()
                    if h.name != "ascend.forward_extend" and version in h.sglang_versions])
    assert f"registered {expected} hooks for SGLang {version}" in out
    assert "ascend.forward_extend (needs torch_npu, sgl_kernel_npu)" in out
    assert out.count("Executed general plugin: moss_vl") == 1
    for hook in all_hooks():
        if hook.name != "ascend.forward_extend" and version in hook.sglang_versions:
            assert hook.target in out


def test_unsupported_sglang_logs_one_line_and_registers_nothing(monkeypatch, caplog):
    registered = []
    monkeypatch.setattr(plugin, "_registered", False)
    monkeypatch.setattr(plugin, "sglang_version", lambda: "0.4.0")
    from sglang.srt.plugins import hook_registry

    monkeypatch.setattr(hook_registry.HookRegistry, "register", lambda *a, **k: registered.append(a))
    with caplog.at_level("INFO", logger="moss_vl"):
        plugin.register()
        plugin.register()
    lines = [r.getMessage() for r in caplog.records if r.name == "moss_vl"]
    assert len(lines) == 1
    assert "SGLang 0.4.0 is not supported" in lines[0]
    assert "0.5.17" in lines[0] and "0.5.23" in lines[0]
    assert registered == []


def test_disabled_hooks_are_left_out():
    chosen, skipped = plugin.select_hooks("0.5.23", {"moss_vl.insert_separator_tokens"})
    assert "moss_vl.insert_separator_tokens" not in [h.name for h in chosen]
    assert any("MOSS_VL_DISABLE_HOOKS" in s for s in skipped)


def test_every_hook_names_a_known_kind_and_versions():
    for hook in all_hooks():
        assert hook.kind in ("before", "after", "around", "replace")
        assert hook.sglang_versions
