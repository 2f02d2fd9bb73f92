"""The plugin as SGLang loads it.

Contract: the installed ``sglang.srt.plugins`` entry point is discovered by
``load_plugins()``; ``register()`` is idempotent; the installed SGLang is
matched to a supported line by range (post-releases included): outside every
line it registers nothing on cuda (one warning, ``moss_vl:plugin_info``
says so) and refuses to start on npu; hooks whose platform modules are absent
(torch_npu) are left out, and ``MOSS_VL_DISABLE_HOOKS`` leaves out named
hooks; a bad plugin setting is refused (exit 2) naming variable, value and
choices; after SGLang's ``apply_hooks`` each chosen target is checked to be
wrapped by the plugin's function (``moss_vl:hooks_applied``), and on npu a
mask hook that is left out or did not take effect stops the process.

The npu cases run SGLang's own loader in a subprocess that sees stand-in
``torch_npu``/``sgl_kernel_npu`` packages (tests/npu_stubs.py), so the real
Ascend backend module is what the hooks are applied to.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from moss_vl import metrics, plugin
from moss_vl.hooks import Hook, all_hooks, missing_requirements, sglang_version
from moss_vl.sglang_versions import LINES, line_of
from npu_stubs import write_stub_packages

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")


def run(code, check=True, pythonpath=(), **env):
    environment = dict(os.environ, **env)
    environment["PYTHONPATH"] = os.pathsep.join(
        [*pythonpath, SRC, *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if check:
        assert result.returncode == 0, result.stderr[-3000:]
    return result


def collect(path) -> dict[str, float]:
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.multiprocess import MultiProcessCollector
    from prometheus_client.parser import text_string_to_metric_families

    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(path))
    samples = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            samples[f"{s.name}{{{labels}}}"] = s.value
    return samples


LOAD = """
import logging; logging.basicConfig(level=logging.INFO)
from sglang.srt.plugins import load_plugins
load_plugins(); load_plugins()
"""


def installed_hooks(platform_modules=False):
    version = sglang_version()
    return {
        h.name for h in all_hooks()
        if h.supports(version) and (platform_modules or h.name != "ascend.forward_extend")
    }


def test_the_entry_point_applies_every_hook_on_npu_and_exports_it(tmp_path):
    """SGLang's own loader, twice (idempotent), on npu: the real Ascend backend
    module is patched too, and /metrics would carry one series per hook."""
    stubs = write_stub_packages(tmp_path / "stubs")
    prom = tmp_path / "prom"
    prom.mkdir()
    out = run(LOAD, pythonpath=[stubs], SGLANG_PLUGINS="moss_vl", MOSS_VL_DEVICE="npu",
              PROMETHEUS_MULTIPROC_DIR=str(prom))
    text = out.stdout + out.stderr
    assert "Loaded plugin moss_vl from group sglang.srt.plugins" in text
    assert text.count("Executed general plugin: moss_vl") == 1
    version = sglang_version()
    expected = installed_hooks(platform_modules=True)
    assert (
        f"registered {len(expected)} hooks for SGLang {version} (line {line_of(version).name}, npu)"
        in text
    )
    for hook in all_hooks():
        if hook.name in expected and hook.supports(version):
            assert f"to {hook.target} (from: plugin=moss_vl" in text
    assert f"{len(expected)} of {len(expected)} hooks in effect" in text
    samples = collect(prom)
    for name in expected:
        assert samples[f'moss_vl:hooks_applied{{hook="{name}"}}'] == 1
    info = [k for k in samples if k.startswith("moss_vl:plugin_info")]
    assert info == [
        f'moss_vl:plugin_info{{sglang_supported="true",sglang_version="{sglang_version()}",'
        f'version="{plugin.__version__}"}}'
    ]


def test_on_npu_a_mask_hook_that_did_not_take_effect_stops_the_process(tmp_path):
    """Upstream drift, for real: the native backend's method is gone before
    SGLang applies the hooks; apply_hooks only logs, the plugin stops."""
    stubs = write_stub_packages(tmp_path / "stubs")
    prom = tmp_path / "prom"
    prom.mkdir()
    out = run(
        """
from sglang.srt.hardware_backend.npu.attention import ascend_torch_native_backend as m
del m.AscendTorchNativeAttnBackend.run_sdpa_forward_extend
""" + LOAD + "print('SERVED')",
        check=False, pythonpath=[stubs], SGLANG_PLUGINS="moss_vl", MOSS_VL_DEVICE="npu",
        PROMETHEUS_MULTIPROC_DIR=str(prom),
    )
    assert out.returncode == plugin.EXIT_FAILED, out.stderr[-3000:]
    assert "SERVED" not in out.stdout
    assert "Failed to apply hooks to sglang.srt.hardware_backend.npu" in out.stderr
    assert (
        "hooks required on npu did not take effect after HookRegistry.apply_hooks: "
        "ascend_native.run_sdpa_forward_extend" in out.stderr
    )
    samples = collect(prom)
    assert samples['moss_vl:hooks_applied{hook="ascend_native.run_sdpa_forward_extend"}'] == 0
    assert samples['moss_vl:hooks_applied{hook="ascend.forward_extend"}'] == 1


@pytest.fixture
def fresh(monkeypatch):
    """A plugin that has not registered yet, with HookRegistry.register and
    the metrics recorded instead of applied."""
    from sglang.srt.plugins import hook_registry

    registered, recorded = [], {}
    monkeypatch.setattr(plugin, "_registered", False)
    monkeypatch.setattr(plugin, "_verify_after_apply", lambda registry: None)
    monkeypatch.setattr(
        hook_registry.HookRegistry, "register", lambda *a, **k: registered.append(a)
    )
    monkeypatch.setattr(metrics, "set_plugin_info", lambda *a: recorded.__setitem__("info", a))
    monkeypatch.setattr(
        metrics, "set_hooks_applied", lambda d: recorded.setdefault("applied", {}).update(d)
    )
    for var in ("MOSS_VL_DEVICE", "MOSS_VL_CROSS_ATTN_PLAN", "MOSS_VL_DISABLE_HOOKS"):
        monkeypatch.delenv(var, raising=False)
    return registered, recorded


def test_unsupported_sglang_on_cuda_logs_one_line_and_registers_nothing(fresh, monkeypatch, caplog):
    registered, recorded = fresh
    monkeypatch.setenv("MOSS_VL_DEVICE", "cuda")
    monkeypatch.setattr(plugin, "sglang_version", lambda: "0.5.24")
    with caplog.at_level("INFO", logger="moss_vl"):
        plugin.register()
        plugin.register()
    lines = [r.getMessage() for r in caplog.records if r.name == "moss_vl"]
    assert len(lines) == 1
    assert "SGLang 0.5.24 is not supported" in lines[0]
    for line in LINES:
        assert str(line) in lines[0]
    assert registered == []
    assert recorded["info"] == (plugin.__version__, "0.5.24", False)
    assert recorded["applied"] and not any(recorded["applied"].values())
    assert "ascend.forward_extend" not in recorded["applied"]  # not a cuda hook


def test_unsupported_sglang_on_npu_refuses_to_start(fresh, monkeypatch, caplog):
    registered, _ = fresh
    monkeypatch.setenv("MOSS_VL_DEVICE", "npu")
    monkeypatch.setattr(plugin, "sglang_version", lambda: "0.5.24")
    with pytest.raises(plugin.StartRefused) as refused:
        plugin.register()
    assert refused.value.code == plugin.EXIT_REFUSED
    message = str(refused.value)
    assert "SGLang 0.5.24 is not supported on npu" in message
    for line in LINES:
        assert str(line) in message
    assert "\n" not in message
    assert registered == []


@pytest.mark.parametrize("suffix", [".post1", "+cann8.2"])
def test_a_post_release_or_local_build_of_a_line_is_supported(fresh, monkeypatch, suffix):
    registered, recorded = fresh
    monkeypatch.setenv("MOSS_VL_DEVICE", "cuda")
    version = sglang_version()
    monkeypatch.setattr(plugin, "sglang_version", lambda: version + suffix)
    plugin.register()
    assert {a[0] for a in registered} == {
        h.target for h in all_hooks() if h.supports(version) and not missing_requirements(h)
    }
    assert recorded["info"] == (plugin.__version__, version + suffix, True)


@pytest.mark.parametrize(
    "var, value, expected",
    [
        ("MOSS_VL_CROSS_ATTN_PLAN", "segments",
         "MOSS_VL_CROSS_ATTN_PLAN='segments': expected one of staircase, mask"),
        ("MOSS_VL_DISABLE_HOOKS", "moss_vl.insert_separator",
         "MOSS_VL_DISABLE_HOOKS='moss_vl.insert_separator': unknown hook "
         "'moss_vl.insert_separator'; expected comma-separated names from: "),
    ],
)
def test_a_bad_setting_is_refused_at_register(fresh, monkeypatch, var, value, expected):
    registered, _ = fresh
    monkeypatch.setenv(var, value)
    with pytest.raises(plugin.StartRefused) as refused:
        plugin.register()
    assert refused.value.code == plugin.EXIT_REFUSED
    assert expected in str(refused.value)
    if var == "MOSS_VL_DISABLE_HOOKS":
        assert "moss_vl.insert_separator_tokens" in str(refused.value)  # the choices
    assert registered == []


def test_a_bad_setting_leaves_sglangs_loader(fresh, monkeypatch):
    """load_plugins() catches a plugin's Exception and carries on: the refusal
    must leave the process anyway (SystemExit, code 2)."""
    import sglang.srt.plugins as plugins

    monkeypatch.setattr(plugins, "_plugins_loaded", False)
    monkeypatch.setattr(
        plugins, "load_plugins_by_group", lambda *a, **k: {"moss_vl": (plugin.register, "moss-vl")}
    )
    applied = []
    monkeypatch.setattr(plugins.HookRegistry, "apply_hooks", lambda: applied.append(1))
    monkeypatch.setenv("MOSS_VL_CROSS_ATTN_PLAN", "segments")
    with pytest.raises(SystemExit) as exited:
        plugins.load_plugins()
    assert exited.value.code == 2
    assert applied == []


def test_disabling_a_mask_hook_on_npu_is_refused(fresh, monkeypatch):
    monkeypatch.setenv("MOSS_VL_DEVICE", "npu")
    monkeypatch.setenv("MOSS_VL_DISABLE_HOOKS", "ascend_native.run_sdpa_forward_extend")
    with pytest.raises(plugin.StartRefused, match=r"hooks required on npu are left out: "
                       r"ascend_native.run_sdpa_forward_extend \(MOSS_VL_DISABLE_HOOKS\)"):
        plugin.register()


def test_disabled_hooks_are_left_out_and_exported_as_not_applied(fresh, monkeypatch):
    registered, recorded = fresh
    monkeypatch.setenv("MOSS_VL_DEVICE", "cuda")
    monkeypatch.setenv("MOSS_VL_DISABLE_HOOKS", "moss_vl.insert_separator_tokens")
    plugin.register()
    assert "moss_vl.insert_separator_tokens" not in {h.name for h in plugin._chosen}
    assert recorded["applied"] == {"moss_vl.insert_separator_tokens": False}
    chosen, skipped = plugin.select_hooks(sglang_version(), {"moss_vl.insert_separator_tokens"})
    assert any("MOSS_VL_DISABLE_HOOKS" in s for s in skipped)


def test_verify_applied_sees_what_is_and_is_not_in_effect(plugin_loaded, monkeypatch):
    recorded = {}
    monkeypatch.setattr(metrics, "set_hooks_applied", recorded.update)
    version = sglang_version()
    chosen = [h for h in all_hooks() if h.supports(version) and h.name.startswith("moss_vl.")]
    assert plugin.verify_applied(chosen, "cuda") == {h.name: True for h in chosen}
    assert recorded == {h.name: True for h in chosen}
    recorded.clear()

    def another_function(self, forward_batch):
        return None

    stray = Hook(name="moss_vl.build_cross_attention_custom_mask", target=chosen[0].target,
                 kind="replace", func=another_function, signature=("self", "forward_batch"))
    assert plugin.verify_applied([stray], "cuda") == {stray.name: False}
    assert recorded == {stray.name: False}
    required = Hook(name="stray", target=chosen[0].target, kind="replace", func=another_function,
                    signature=("self", "forward_batch"), required_on=("npu",))
    with pytest.raises(plugin.StartRefused) as refused:
        plugin.verify_applied([required], "npu")
    assert refused.value.code == plugin.EXIT_FAILED


def test_every_hook_names_a_known_kind_and_lines():
    for hook in all_hooks():
        assert hook.kind in ("before", "after", "around", "replace")
        assert hook.sglang_versions and set(hook.sglang_versions) <= set(LINES)


def test_each_line_has_exactly_one_body_per_hook():
    names = {h.name for h in all_hooks()}
    for line in LINES:
        for name in names:
            bodies = [h for h in all_hooks() if h.name == name and line in h.sglang_versions]
            assert len(bodies) == 1, f"{name}: {len(bodies)} bodies for SGLang line {line}"


def test_a_hook_names_its_lines_by_name_or_line():
    def f(self):
        return None

    by_name = Hook(name="x", target="a.b", kind="after", func=f, signature=("self",),
                   sglang_versions=("0.5.23",))
    assert by_name.sglang_versions == (line_of("0.5.23"),)
    assert Hook(name="x", target="a.b", kind="after", func=f, signature=("self",)).sglang_versions == LINES
    with pytest.raises(ValueError, match="unknown SGLang line '0.5.99'"):
        Hook(name="x", target="a.b", kind="after", func=f, signature=("self",),
             sglang_versions=("0.5.99",))
