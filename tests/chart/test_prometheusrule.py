"""templates/prometheusrule.yaml: alerts on moss_vl:*, sglang:* and target health.

Contract:
- Prometheus's own engine accepts the rendered rules (`promtool check rules`)
  and evaluates every alert as intended (`promtool test rules`): each fires on
  its failure series once its `for` has elapsed (and not before), stays silent
  on healthy series and on another release's series, and renders its labels
  and annotations, a `runbook_url` into docs/runbooks.md among them.
- TTFT and "no ready replica" are one rule per pool, labelled `device`,
  selecting that pool's pods or Deployment only, so a dead or slow pool fires
  while the other serves.
- The regressions of issue 17 stay fixed: MossVLNoReadyReplica is silent in a
  cluster without kube-state-metrics whose servers answer; the encoder-cache
  alert is silent on npu pools and on unique-image traffic; the router, when
  deployed, has its own down/not-scraped alerts.
- Expressions are valid PromQL over series that exist (moss_vl names from the
  plugin's real registry, sglang names from the installed SGLang 0.5.23, `up`,
  kube-state-metrics) and select pods by the labels the ServiceMonitor/
  PodMonitor copy from them, never by a pod-name regex.
- A plugin hook not in effect (`moss_vl:hooks_applied == 0`) and an
  unsupported SGLang (`moss_vl:plugin_info{sglang_supported="false"}`) warn.
- Every alert has a section in docs/runbooks.md saying what it means, how to
  confirm it and what to do.
"""

from __future__ import annotations

import re

import pytest

from . import promql, promtool
from .chart_render import (
    NAMESPACE,
    REPO,
    RELEASE,
    SCENARIOS,
    pools_of,
    render,
    render_scenario,
    scenario_file,
    scenario_values,
)

WITH_RULES = [s for s in SCENARIOS if scenario_values(s)["metrics"]["prometheusRule"]["enabled"]]
RUNBOOKS = REPO / "docs" / "runbooks.md"
RUNBOOK_URL = "https://github.com/OpenMOSS/MOSS-VL/blob/main/docs/runbooks.md"
OTHER_RELEASE = "other"


def rules(doc) -> dict[str, dict]:
    """Alert name -> rule; per-pool rules as `<alert>/<device>`."""
    out = {}
    for g in doc["spec"]["groups"]:
        for r in g["rules"]:
            device = r.get("labels", {}).get("device")
            out[f"{r['alert']}/{device}" if device else r["alert"]] = r
    return out


def alert_names(doc) -> set[str]:
    return {r["alert"] for g in doc["spec"]["groups"] for r in g["rules"]}


def rendered_rule(scenario: str, *sets: str) -> dict:
    r = render(*sets, values_file=scenario_file(scenario)) if sets else render_scenario(scenario)
    return r.get("PrometheusRule", RELEASE)


@pytest.fixture(params=WITH_RULES)
def case(request):
    name = request.param
    return rules(rendered_rule(name)), scenario_values(name)


def test_scenarios_cover_rules_and_no_rules(rendered, values):
    assert WITH_RULES, "no ci scenario enables the PrometheusRule"
    assert len(rendered.all("PrometheusRule")) == int(
        values["metrics"]["prometheusRule"]["enabled"]
    )


def test_expressions_parse_and_use_real_series(case):
    all_rules, _ = case
    for name, rule in all_rules.items():
        used = promql.metric_names(rule["expr"])
        assert used, name
        unknown = sorted(n for n in used if not promql.is_known(n))
        assert not unknown, f"{name} uses series nothing exports: {unknown}"


def test_selectors_use_the_pod_labels_not_pod_names(case):
    all_rules, _ = case
    for name, rule in all_rules.items():
        own = rule.get("labels", {}).get("device")
        for sel in promql.selectors(rule["expr"]):
            m = promql.matchers(sel)
            assert m["namespace"] == ("=", NAMESPACE), name
            assert "pod" not in m, f"{name} selects pods by name: {m['pod']}"
            if sel.name.startswith("kube_deployment"):
                # kube-state-metrics labels the Deployment, not the pod.
                assert own and m["deployment"] == ("=", f"{RELEASE}-{own}"), name
                continue
            assert m["app_kubernetes_io_instance"] == ("=", RELEASE), name
            assert m["app_kubernetes_io_component"][0] == "=", name
            if own:
                assert m["device"] == ("=", own), f"{name} reaches beyond its pool"


def test_per_pool_rules(case):
    r, values = case
    cfg = values["metrics"]["prometheusRule"]
    pools = pools_of(values)
    for device in pools:
        ttft = r[f"MossVLTimeToFirstTokenHigh/{device}"]
        assert promql.metric_names(ttft["expr"]) == {"sglang:time_to_first_token_seconds_bucket"}
        assert ttft["expr"].endswith(f"> {cfg['ttftP95Seconds']}")
        no_ready = r[f"MossVLNoReadyReplica/{device}"]
        assert no_ready["labels"]["severity"] == "critical"
        assert no_ready["for"] == cfg["noReadyReplicaFor"]
        assert f'deployment="{RELEASE}-{device}"' in no_ready["expr"]
    per_pool = [k for k in r if "/" in k]
    assert sorted(per_pool) == sorted(
        f"{a}/{d}" for a in ("MossVLNoReadyReplica", "MossVLTimeToFirstTokenHigh") for d in pools
    )


def test_the_monitors_put_those_labels_on_the_series():
    for kind, key in (("ServiceMonitor", "endpoints"), ("PodMonitor", "podMetricsEndpoints")):
        flag = "serviceMonitor" if kind == "ServiceMonitor" else "podMonitor"
        r = render(f"metrics.{flag}.enabled=true", "router.enabled=true")
        for name, component in ((RELEASE, "server"), (f"{RELEASE}-router", "router")):
            (ep,) = r.get(kind, name)["spec"][key]
            targets = {x["targetLabel"]: x["sourceLabels"] for x in ep["relabelings"]}
            assert targets["app_kubernetes_io_instance"] == [
                "__meta_kubernetes_pod_label_app_kubernetes_io_instance"
            ]
            assert targets["app_kubernetes_io_component"] == [
                "__meta_kubernetes_pod_label_app_kubernetes_io_component"
            ]
            assert ("device" in targets) == (component == "server"), (kind, name)


def test_promtool_accepts_the_rules(case, tmp_path):
    for scenario in WITH_RULES:
        for sets in ((), ("router.enabled=true",)):
            path = promtool.write_rule_file(rendered_rule(scenario, *sets), tmp_path)
            proc = promtool.check_rules(path)
            assert proc.returncode == 0, proc.stdout + proc.stderr
            assert re.search(r"SUCCESS: \d+ rules found", proc.stdout), proc.stdout


# ---- promtool unit tests ---------------------------------------------------------


def labels_text(labels: dict[str, str]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in labels.items())


def server(device: str, pod: str, release: str = RELEASE, **extra: str) -> dict[str, str]:
    """The labels a server series carries once the ServiceMonitor relabelled it."""
    return {
        "namespace": NAMESPACE,
        "app_kubernetes_io_instance": release,
        "app_kubernetes_io_component": "server",
        "device": device,
        "pod": pod,
        "job": f"{release}-server",
        "instance": "10.0.0.7:30000",
        **extra,
    }


def router(release: str = RELEASE) -> dict[str, str]:
    return {
        "namespace": NAMESPACE,
        "app_kubernetes_io_instance": release,
        "app_kubernetes_io_component": "router",
        "pod": f"{release}-router-6b7c8d9f5-abcde",
        "job": f"{release}-router",
        "instance": "10.0.0.9:29000",
    }


def series(name: str, labels: dict[str, str], values: str) -> dict:
    return {"series": f"{name}{{{labels_text(labels)}}}", "values": values}


def histogram(name: str, labels: dict[str, str], buckets: dict[str, str]) -> list[dict]:
    return [series(f"{name}_bucket", {**labels, "le": le}, v) for le, v in buckets.items()]


def runbook(alert: str) -> str:
    return f"{RUNBOOK_URL}#{alert.lower()}"


def group(input_series: list[dict], *checks: tuple[str, str, list[dict]]) -> dict:
    """One promtool test: the series, then (eval_time, alertname, expected alerts)."""
    return {
        "interval": "1m",
        "input_series": input_series,
        "alert_rule_test": [
            {"eval_time": t, "alertname": name, "exp_alerts": alerts} for t, name, alerts in checks
        ],
    }


def alert(labels: dict[str, str], summary: str, description: str, name: str) -> dict:
    return {
        "exp_labels": labels,
        "exp_annotations": {
            "summary": summary,
            "description": description,
            "runbook_url": runbook(name),
        },
    }


def unit_tests(values: dict, with_router: bool) -> list[dict]:
    """promtool tests for every alert of a release with these values."""
    cfg = values["metrics"]["prometheusRule"]
    device = pools_of(values)[0]
    pod = f"{RELEASE}-{device}-7d9f8b6c5d-x2k9q"
    other_pod = f"{OTHER_RELEASE}-{device}-7d9f8b6c5d-x2k9q"
    deployments = [f"{RELEASE}-{d}" for d in pools_of(values)]
    tests = []

    # -- MossVLCrossAttentionMaskDropped: no `for`, one dropped mask is enough.
    name = "MossVLCrossAttentionMaskDropped"
    mask = "moss_vl:cross_attention_mask_path_total"
    tests.append(
        group(
            [series(mask, server(device, pod, path="dropped", plan="mask"), "0 0 1 1 1 1 1 1 1")],
            (
                "3m",
                name,
                [
                    alert(
                        {
                            "severity": "critical",
                            "namespace": NAMESPACE,
                            "device": device,
                            "pod": pod,
                            "plan": "mask",
                        },
                        f"MOSS-VL dropped a cross-attention mask on {pod}",
                        f'moss_vl:cross_attention_mask_path_total{{path="dropped"}} grew on pod {pod} '
                        f"({device} pool, plan mask): a mask was built but the attention backend did "
                        "not apply it, so answers about images are wrong.",
                        name,
                    )
                ],
            ),
        )
    )
    tests.append(
        group(
            [
                series(mask, server(device, pod, path="dropped", plan="mask"), "0x10"),
                series(mask, server(device, pod, path="flashinfer", plan="staircase"), "0+50x10"),
                # Another release's dropped mask is not this release's alert.
                series(
                    mask,
                    server(device, other_pod, OTHER_RELEASE, path="dropped", plan="mask"),
                    "0+1x10",
                ),
            ],
            ("5m", name, []),
        )
    )

    # -- MossVLMaskBuildSlow: p95 inside (0.1, 0.25] s -> 0.2425 s.
    name = "MossVLMaskBuildSlow"
    limit = cfg["maskBuildP95Seconds"]
    assert limit == 0.1, "the series below are built around the default threshold"
    slow = {"0.001": "0x30", "0.1": "0x30", "0.25": "0+10x30", "+Inf": "0+10x30"}
    fast = {"0.001": "0+10x30", "0.1": "0+10x30", "0.25": "0+10x30", "+Inf": "0+10x30"}
    labels = {"severity": "warning", "namespace": NAMESPACE, "device": device, "pod": pod}
    tests.append(
        group(
            histogram("moss_vl:mask_build_seconds", server(device, pod), slow),
            ("10m", name, []),  # pending: its 15m `for` has not elapsed
            (
                "20m",
                name,
                [
                    alert(
                        labels,
                        f"Cross-attention mask build p95 above {limit} s on {pod}",
                        "Building the cross-attention mask takes 242.5ms at p95; prefill "
                        "latency grows with it.",
                        name,
                    )
                ],
            ),
        )
    )
    tests.append(
        group(
            histogram("moss_vl:mask_build_seconds", server(device, pod), fast),
            ("20m", name, []),
        )
    )

    # -- MossVLHookNotApplied: a hook chosen for the platform reads 0 for 5m.
    name = "MossVLHookNotApplied"
    hook = "sglang.srt.models.moss_vl.MossVLForConditionalGeneration._build_cross_attention_custom_mask"
    applied = "moss_vl:hooks_applied"
    tests.append(
        group(
            [series(applied, server(device, pod, hook=hook), "0x10")],
            ("3m", name, []),
            (
                "8m",
                name,
                [
                    alert(
                        {
                            "severity": "warning",
                            "namespace": NAMESPACE,
                            "device": device,
                            "pod": pod,
                            "hook": hook,
                        },
                        f"moss_vl hook {hook} is not in effect on {pod}",
                        "The plugin chose the hook but it does not wrap its SGLang target "
                        '(SGLang logged "Failed to apply hooks to ..."), or MOSS_VL_DISABLE_HOOKS '
                        "names it, or SGLang is unsupported. On cuda the server runs without "
                        "that patch; on npu a missing mask hook stops the server instead. See "
                        "docs/upgrading-sglang.md.",
                        name,
                    )
                ],
            ),
        )
    )
    tests.append(group([series(applied, server(device, pod, hook=hook), "1x10")], ("8m", name, [])))

    # -- MossVLSGLangUnsupported: plugin_info says the SGLang line is not supported.
    name = "MossVLSGLangUnsupported"
    info = "moss_vl:plugin_info"

    def plugin_info(supported: str) -> dict[str, str]:
        return server(
            device, pod, version="0.1.0", sglang_version="0.6.0", sglang_supported=supported
        )

    tests.append(
        group(
            [series(info, plugin_info("false"), "1x10")],
            ("3m", name, []),
            (
                "8m",
                name,
                [
                    alert(
                        {
                            "severity": "warning",
                            "namespace": NAMESPACE,
                            "device": device,
                            "pod": pod,
                            "sglang_version": "0.6.0",
                        },
                        f"SGLang 0.6.0 runs unpatched on {pod}",
                        "The installed SGLang is in no line moss_vl supports, so no moss_vl hook "
                        "is registered. Run `make test-compat SGLANG=0.6.0` and follow "
                        "docs/upgrading-sglang.md, or deploy a supported image.",
                        name,
                    )
                ],
            ),
        )
    )
    tests.append(group([series(info, plugin_info("true"), "1x10")], ("8m", name, [])))

    # -- MossVLEncoderCacheHitRatioLow: 1 hit per 9 misses (10 %) while the
    # prefix cache hits 80 % of tokens: repeated prompts, images re-encoded.
    name = "MossVLEncoderCacheHitRatioLow"
    hits, misses = "moss_vl:encoder_cache_hits_total", "moss_vl:encoder_cache_misses_total"
    prefix = "sglang:cache_hit_rate"
    assert cfg["encoderCacheHitRatio"] == 0.2 and cfg["encoderCachePrefixHitRatio"] == 0.5

    def encoder(dev: str, hit_per_min: int, miss_per_min: int, prefix_hit: str) -> list[dict]:
        p = f"{RELEASE}-{dev}-7d9f8b6c5d-x2k9q"
        return [
            series(hits, server(dev, p), f"0+{hit_per_min}x70"),
            series(misses, server(dev, p), f"0+{miss_per_min}x70"),
            series(prefix, server(dev, p, tp_rank="0"), f"{prefix_hit}x70"),
        ]

    tests.append(
        group(
            encoder("cuda", 1, 9, "0.8"),
            ("20m", name, []),
            (
                "60m",
                name,
                [
                    alert(
                        {"severity": "warning", "namespace": NAMESPACE, "device": "cuda"},
                        "Images re-encoded although prompts hit the prefix cache (cuda pool)",
                        "Only 10% of encoder lookups hit while the prefix cache hit rate is above "
                        "0.5: repeated images are encoded again instead of being reused from the "
                        "KV cache.",
                        name,
                    )
                ],
            ),
        )
    )
    # Silent on an npu pool (no radix cache there) ...
    tests.append(group(encoder("npu", 1, 9, "0.8"), ("60m", name, [])))
    # ... on unique images (the prefix cache hardly hits: nothing to reuse) ...
    tests.append(group(encoder("cuda", 1, 9, "0.1"), ("60m", name, [])))
    # ... and when the encoder cache does hit.
    tests.append(group(encoder("cuda", 5, 5, "0.8"), ("60m", name, [])))

    # -- MossVLPrefixMatchesDropped: 2 per second for 30m.
    name = "MossVLPrefixMatchesDropped"
    dropped = "moss_vl:prefix_matches_dropped_total"
    tests.append(
        group(
            [series(dropped, server(device, pod), "0+120x60")],
            ("20m", name, []),
            (
                "50m",
                name,
                [
                    alert(
                        {"severity": "info", "namespace": NAMESPACE, "device": device, "pod": pod},
                        f"Many prefix matches ending inside an image span on {pod}",
                        "More than one prefix match per second is dropped because it ends inside "
                        "an encoder span (paged KV); cached prefixes are being recomputed.",
                        name,
                    )
                ],
            ),
        )
    )
    tests.append(group([series(dropped, server(device, pod), "0+30x60")], ("50m", name, [])))

    # -- MossVLTimeToFirstTokenHigh: p95 inside (2.5, 5] s -> 4.875 s.
    name = "MossVLTimeToFirstTokenHigh"
    ttft = "sglang:time_to_first_token_seconds"
    assert cfg["ttftP95Seconds"] == 3
    slow = {"1": "0x30", "2.5": "0x30", "5": "0+10x30", "+Inf": "0+10x30"}
    fast = {"1": "0+10x30", "2.5": "0+10x30", "5": "0+10x30", "+Inf": "0+10x30"}
    tests.append(
        group(
            histogram(ttft, server(device, pod, model_name="moss-vl"), slow),
            ("8m", name, []),
            (
                "20m",
                name,
                [
                    alert(
                        {"severity": "warning", "namespace": NAMESPACE, "device": device},
                        f"MOSS-VL time to first token p95 above 3 s on the {device} pool",
                        f"TTFT p95 of Deployment {RELEASE}-{device} is 4.875s (QA bar 3 s). "
                        "Check the queue and scale out.",
                        name,
                    )
                ],
            ),
        )
    )
    tests.append(
        group(histogram(ttft, server(device, pod, model_name="moss-vl"), fast), ("20m", name, []))
    )

    # -- MossVLQueueGrowing: above 32 and rising for 10m.
    name = "MossVLQueueGrowing"
    queue = "sglang:num_queue_reqs"
    assert cfg["queueLength"] == 32
    tests.append(
        group(
            [series(queue, server(device, pod, tp_rank="0"), "40+2x30")],
            ("8m", name, []),
            (
                "20m",
                name,
                [
                    alert(
                        {"severity": "warning", "namespace": NAMESPACE, "device": device},
                        f"MOSS-VL request queue above 32 and growing ({device} pool)",
                        "80 requests wait; the replicas cannot keep up.",
                        name,
                    )
                ],
            ),
        )
    )
    # A long but steady queue, and a growing but short one, are not alerts.
    tests.append(
        group([series(queue, server(device, pod, tp_rank="0"), "100x30")], ("20m", name, []))
    )
    tests.append(
        group([series(queue, server(device, pod, tp_rank="0"), "0+1x30")], ("20m", name, []))
    )

    # -- MossVLKVCacheNearlyFull: 90 % for 5m.
    name = "MossVLKVCacheNearlyFull"
    usage = "sglang:token_usage"
    assert cfg["tokenUsage"] == 0.8
    tests.append(
        group(
            [series(usage, server(device, pod, tp_rank="0"), "0.9x20")],
            ("3m", name, []),
            (
                "10m",
                name,
                [
                    alert(
                        {
                            "severity": "warning",
                            "namespace": NAMESPACE,
                            "device": device,
                            "pod": pod,
                        },
                        f"KV cache usage above 0.8 on {pod}",
                        "Token usage is 90%; requests will be retracted or queued.",
                        name,
                    )
                ],
            ),
        )
    )
    tests.append(
        group([series(usage, server(device, pod, tp_rank="0"), "0.5x20")], ("10m", name, []))
    )

    # -- MossVLNoReadyReplica
    name = "MossVLNoReadyReplica"
    assert cfg["noReadyReplicaFor"] == "1m"
    ksm = "kube_deployment_status_replicas_available"

    def down(d: str) -> dict:
        return alert(
            {"severity": "critical", "namespace": NAMESPACE, "device": d},
            f"No MOSS-VL replica of the {d} pool is ready in {NAMESPACE}",
            f"Deployment {RELEASE}-{d} has no available replica (or none answers its "
            f"scrape); requests routed to the {d} pool fail.",
            name,
        )

    def deployment(name_: str) -> dict[str, str]:
        return {"namespace": NAMESPACE, "deployment": name_, "job": "kube-state-metrics"}

    pools = pools_of(values)
    # kube-state-metrics says 0 available: every pool fires, each on its own.
    tests.append(
        group(
            [series(ksm, deployment(d), "1 1 0x10") for d in deployments],
            ("2m", name, []),
            ("6m", name, [down(d) for d in pools]),
        )
    )
    # One pool dead by kube-state-metrics while the other serves: that pool only.
    if len(pools) > 1:
        tests.append(
            group(
                [series(ksm, deployment(f"{RELEASE}-{pools[0]}"), "0x10")]
                + [series(ksm, deployment(f"{RELEASE}-{d}"), "1x10") for d in pools[1:]],
                ("6m", name, [down(pools[0])]),
            )
        )
    # No kube-state-metrics, every server scrape of a pool fails.
    tests.append(
        group([series("up", server(device, pod), "1 1 0x10")], ("6m", name, [down(device)]))
    )
    # No kube-state-metrics, servers answer: silent (`or vector(0)` fired here).
    tests.append(
        group(
            [series("up", server(d, f"{RELEASE}-{d}-7d9f8b6c5d-x2k9q"), "1x10") for d in pools]
            # Another release, down, in the same namespace.
            + [series(ksm, deployment(f"{OTHER_RELEASE}-{device}"), "0x10")],
            ("6m", name, []),
        )
    )
    # /metrics unreachable while kube-state-metrics sees available pods: no outage.
    tests.append(
        group(
            [series("up", server(device, pod), "0x10")]
            + [series(ksm, deployment(d), "1x10") for d in deployments],
            ("6m", name, []),
        )
    )

    # -- MossVLServerNotScraped
    name = "MossVLServerNotScraped"
    tests.append(
        group(
            [series("up", server(device, other_pod, OTHER_RELEASE), "1x20")],
            ("5m", name, []),
            (
                "15m",
                name,
                [
                    alert(
                        {
                            "severity": "warning",
                            "namespace": NAMESPACE,
                            "app_kubernetes_io_instance": RELEASE,
                            "app_kubernetes_io_component": "server",
                        },
                        f"Prometheus scrapes no MOSS-VL server pod in {NAMESPACE}",
                        "No up series carries this release's server labels; either no server pod "
                        "runs or the ServiceMonitor/PodMonitor is not picked up, and every other "
                        "MOSS-VL alert is blind.",
                        name,
                    )
                ],
            ),
        )
    )
    tests.append(group([series("up", server(device, pod), "1x20")], ("15m", name, [])))

    if with_router:
        name = "MossVLRouterDown"
        tests.append(
            group(
                [series("up", router(), "0x10"), series("up", server(device, pod), "1x10")],
                ("1m", name, []),
                (
                    "5m",
                    name,
                    [
                        alert(
                            {"severity": "critical", "namespace": NAMESPACE},
                            f"The MOSS-VL router answers no scrape in {NAMESPACE}",
                            "Every sglang-router pod of this release fails its /metrics scrape; "
                            "clients reach the servers only through the router.",
                            name,
                        )
                    ],
                ),
            )
        )
        tests.append(
            group(
                [series("up", router(), "1x10"), series("up", router(OTHER_RELEASE), "0x10")],
                ("5m", name, []),
            )
        )
        name = "MossVLRouterNotScraped"
        tests.append(
            group(
                [series("up", server(device, pod), "1x20")],
                ("5m", name, []),
                (
                    "15m",
                    name,
                    [
                        alert(
                            {
                                "severity": "warning",
                                "namespace": NAMESPACE,
                                "app_kubernetes_io_instance": RELEASE,
                                "app_kubernetes_io_component": "router",
                            },
                            f"Prometheus scrapes no MOSS-VL router pod in {NAMESPACE}",
                            "No up series carries this release's router labels; either no router "
                            "pod runs or its ServiceMonitor/PodMonitor is not picked up.",
                            name,
                        )
                    ],
                ),
            )
        )
        tests.append(group([series("up", router(), "1x20")], ("15m", name, [])))
    return tests


@pytest.mark.parametrize("with_router", [False, True], ids=["servers", "router"])
@pytest.mark.parametrize("scenario", WITH_RULES)
def test_every_alert_fires_on_failure_and_stays_silent_when_healthy(
    scenario, with_router, tmp_path
):
    sets = ("router.enabled=true",) if with_router else ()
    rule = rendered_rule(scenario, *sets)
    path = promtool.write_rule_file(rule, tmp_path)
    tests = unit_tests(scenario_values(scenario), with_router)
    tested = {t["alertname"] for g in tests for t in g["alert_rule_test"]}
    assert tested == alert_names(rule), "every alert needs a promtool unit test"
    proc = promtool.test_rules(path, tests)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout, proc.stdout


def test_the_unit_tests_catch_a_broken_rule(tmp_path):
    # The old availability rule (`or vector(0)`) must fail its test here.
    rule = rendered_rule(WITH_RULES[0])
    for g in rule["spec"]["groups"]:
        for r in g["rules"]:
            if r["alert"] == "MossVLNoReadyReplica":
                r["expr"] = (
                    f'(sum(kube_deployment_status_replicas_available{{namespace="{NAMESPACE}"}})'
                    " or vector(0)) == 0"
                )
    path = promtool.write_rule_file(rule, tmp_path)
    proc = promtool.test_rules(path, unit_tests(scenario_values(WITH_RULES[0]), False))
    assert proc.returncode != 0
    assert "MossVLNoReadyReplica" in proc.stdout + proc.stderr


def test_router_alerts_only_with_a_router():
    assert "MossVLRouterDown" not in rules(
        render("metrics.prometheusRule.enabled=true").get("PrometheusRule", RELEASE)
    )
    with_router = rules(
        render("metrics.prometheusRule.enabled=true", "router.enabled=true").get(
            "PrometheusRule", RELEASE
        )
    )
    assert with_router["MossVLRouterDown"]["labels"]["severity"] == "critical"


def test_every_alert_has_a_runbook_section(case):
    text = RUNBOOKS.read_text()
    headings = {
        m.group(1): m.start() for m in re.finditer(r"^## (MossVL\w+)\s*$", text, re.MULTILINE)
    }
    names = alert_names(rendered_rule(WITH_RULES[0], "router.enabled=true"))
    assert names <= set(headings), f"no runbook for {sorted(names - set(headings))}"
    for key, rule in case[0].items():
        name = key.split("/")[0]
        assert rule["annotations"]["runbook_url"] == runbook(name)
        start = headings[name]
        end = min([p for p in headings.values() if p > start] + [len(text)])
        section = text[start:end]
        for part in ("**Meaning**", "**Confirm**", "**Act**"):
            assert part in section, f"runbook of {name} lacks {part}"


def test_dropped_mask_is_critical(case):
    rule = case[0]["MossVLCrossAttentionMaskDropped"]
    assert rule["labels"]["severity"] == "critical"
    assert "for" not in rule, "one dropped mask is already wrong output"


def test_thresholds_runbook_url_and_extra_rules_from_values():
    r = render(
        "metrics.prometheusRule.enabled=true",
        "metrics.prometheusRule.ttftP95Seconds=2",
        "metrics.prometheusRule.runbookURL=https://wiki.example.com/moss-vl",
        "metrics.prometheusRule.extraRules[0].alert=Custom",
        "metrics.prometheusRule.extraRules[0].expr=vector(1)",
    )
    got = rules(r.get("PrometheusRule", RELEASE))
    assert got["MossVLTimeToFirstTokenHigh/cuda"]["expr"].endswith("> 2")
    assert (
        got["MossVLQueueGrowing"]["annotations"]["runbook_url"]
        == "https://wiki.example.com/moss-vl#mossvlqueuegrowing"
    )
    assert got["Custom"]["expr"] == "vector(1)"


def test_plugin_state_alerts(case):
    r, _ = case
    hook = r["MossVLHookNotApplied"]
    assert promql.metric_names(hook["expr"]) == {"moss_vl:hooks_applied"}
    assert hook["expr"].startswith("min by (namespace, device, pod, hook) (") and hook[
        "expr"
    ].endswith("== 0")
    unsupported = r["MossVLSGLangUnsupported"]
    (sel,) = promql.selectors(unsupported["expr"])
    assert sel.name == "moss_vl:plugin_info"
    assert promql.matchers(sel)["sglang_supported"] == ("=", "false")
    assert {hook["labels"]["severity"], unsupported["labels"]["severity"]} == {"warning"}
