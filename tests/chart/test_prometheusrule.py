"""templates/prometheusrule.yaml: alerts on moss_vl:* and sglang:*.

Contract: every expression is valid PromQL and uses only series that exist
(moss_vl names from the plugin's real prometheus_client registry, sglang
names from the installed SGLang 0.5.23 source, kube-state-metrics for
availability); each selects this release's server pods and nothing else;
a dropped cross-attention mask is critical as soon as one happens
(`increase(...{path="dropped"}[5m]) > 0`); TTFT p95 uses the configured
threshold (3 s by default); queue growth, KV usage, encoder-cache hit ratio
and "no ready replica" (critical) are covered. TTFT and "no ready replica"
are one rule per pool, labelled `device`, selecting that pool's pods or
Deployment only, so a dead or slow pool fires while the other serves. A
plugin hook not in effect (`moss_vl:hooks_applied == 0`) and an unsupported
SGLang (`moss_vl:plugin_info{sglang_supported="false"}`) warn.
"""

from __future__ import annotations

import re

import pytest

from . import promql
from .chart_render import (
    NAMESPACE,
    RELEASE,
    SCENARIOS,
    pools_of,
    render,
    render_scenario,
    scenario_values,
)

WITH_RULES = [s for s in SCENARIOS if scenario_values(s)["metrics"]["prometheusRule"]["enabled"]]


def rules(doc) -> dict[str, dict]:
    """Alert name -> rule; per-pool rules as `<alert>/<device>`."""
    out = {}
    for g in doc["spec"]["groups"]:
        for r in g["rules"]:
            device = r.get("labels", {}).get("device")
            out[f"{r['alert']}/{device}" if device else r["alert"]] = r
    return out


@pytest.fixture(params=WITH_RULES)
def case(request):
    name = request.param
    values = scenario_values(name)
    return rules(render_scenario(name).get("PrometheusRule", RELEASE)), values


def test_scenarios_cover_rules_and_no_rules(rendered, values):
    assert WITH_RULES, "no ci scenario enables the PrometheusRule"
    assert len(rendered.all("PrometheusRule")) == int(
        values["metrics"]["prometheusRule"]["enabled"]
    )


def pod_names(device):
    return f"{RELEASE}-{device}-7d9f8b6c5d-x2k9q"


def test_expressions_parse_and_use_real_series(case):
    all_rules, _ = case
    for name, rule in all_rules.items():
        used = promql.metric_names(rule["expr"])
        assert used, name
        unknown = sorted(n for n in used if not promql.is_known(n))
        assert not unknown, f"{name} uses series nothing exports: {unknown}"


def test_selectors_are_scoped_to_this_release(case):
    all_rules, values = case
    for name, rule in all_rules.items():
        own = rule.get("labels", {}).get("device")
        covered = [own] if own else pools_of(values)
        others = [d for d in ("cuda", "npu") if d not in covered]
        for sel in promql.selectors(rule["expr"]):
            m = promql.matchers(sel)
            assert m["namespace"] == ("=", NAMESPACE), name
            if sel.name.startswith("kube_deployment"):
                op, value = m["deployment"]
                for device in covered:
                    assert re.fullmatch(value, f"{RELEASE}-{device}"), name
                for device in others:
                    assert not re.fullmatch(value, f"{RELEASE}-{device}"), name
                continue
            op, regex = m["pod"]
            assert op == "=~"
            for device in covered:
                assert re.fullmatch(regex, pod_names(device)), f"{name} misses {device} pods"
            for device in others:
                assert not re.fullmatch(regex, pod_names(device)), f"{name} also matches {device}"
            for other in (
                f"{RELEASE}-router-6b7c8d9f5-abcde",
                f"{RELEASE}-loadtest-worker-5f6d7c8b9-qwert",
                f"other-{RELEASE}-cuda-7d9f8b6c5d-x2k9q",
            ):
                assert not re.fullmatch(regex, other), f"{name} also matches {other}"


def test_dropped_mask_is_critical(case):
    rule = case[0]["MossVLCrossAttentionMaskDropped"]
    assert rule["labels"]["severity"] == "critical"
    assert "for" not in rule, "one dropped mask is already wrong output"
    (sel,) = promql.selectors(rule["expr"])
    assert sel.name == "moss_vl:cross_attention_mask_path_total"
    assert promql.matchers(sel)["path"] == ("=", "dropped")
    assert re.search(r"increase\(.*\[5m\]\)\)? > 0$", rule["expr"])


def test_sglang_alerts(case):
    r, values = case
    cfg = values["metrics"]["prometheusRule"]
    for device in pools_of(values):
        ttft = r[f"MossVLTimeToFirstTokenHigh/{device}"]
        assert promql.metric_names(ttft["expr"]) == {"sglang:time_to_first_token_seconds_bucket"}
        assert "histogram_quantile(0.95" in ttft["expr"]
        assert ttft["expr"].endswith(f"> {cfg['ttftP95Seconds']}")
        no_ready = r[f"MossVLNoReadyReplica/{device}"]
        assert no_ready["labels"]["severity"] == "critical"
        assert no_ready["for"] == cfg["noReadyReplicaFor"]
        assert f'deployment="{RELEASE}-{device}"' in no_ready["expr"]
    assert not any(
        k.startswith("MossVLNoReadyReplica/") and k.split("/")[1] not in pools_of(values) for k in r
    )
    assert promql.metric_names(r["MossVLQueueGrowing"]["expr"]) == {"sglang:num_queue_reqs"}
    assert "deriv(" in r["MossVLQueueGrowing"]["expr"]
    assert promql.metric_names(r["MossVLKVCacheNearlyFull"]["expr"]) == {"sglang:token_usage"}


def test_encoder_cache_and_mask_alerts(case):
    r, _ = case
    assert promql.metric_names(r["MossVLEncoderCacheHitRatioLow"]["expr"]) == {
        "moss_vl:encoder_cache_hits_total",
        "moss_vl:encoder_cache_misses_total",
    }
    assert promql.metric_names(r["MossVLMaskBuildSlow"]["expr"]) == {
        "moss_vl:mask_build_seconds_bucket"
    }


def test_thresholds_and_extra_rules_from_values():
    r = render(
        "metrics.prometheusRule.enabled=true",
        "metrics.prometheusRule.ttftP95Seconds=2",
        "metrics.prometheusRule.extraRules[0].alert=Custom",
        "metrics.prometheusRule.extraRules[0].expr=vector(1)",
    )
    got = rules(r.get("PrometheusRule", RELEASE))
    assert got["MossVLTimeToFirstTokenHigh/cuda"]["expr"].endswith("> 2")
    assert got["Custom"]["expr"] == "vector(1)"


def test_plugin_state_alerts(case):
    r, _ = case
    hook = r["MossVLHookNotApplied"]
    assert promql.metric_names(hook["expr"]) == {"moss_vl:hooks_applied"}
    assert hook["expr"].startswith("min by (namespace, pod, hook) (") and hook["expr"].endswith(
        "== 0"
    )
    unsupported = r["MossVLSGLangUnsupported"]
    (sel,) = promql.selectors(unsupported["expr"])
    assert sel.name == "moss_vl:plugin_info"
    assert promql.matchers(sel)["sglang_supported"] == ("=", "false")
    assert {hook["labels"]["severity"], unsupported["labels"]["severity"]} == {"warning"}
