"""Contract of loadtest/moss_vl_stats.py, the generation statistics (no Locust).

- A Distribution's percentiles are the nearest-rank percentiles of the raw
  samples to four significant digits (Locust's buckets read 2996 ms as
  3000 ms and fail a 3 s gate), whatever the spread; merging distributions equals recording all
  samples in one; the wire form the workers send round-trips.
- LLMStats keeps one distribution per scenario and metric, each metric with its
  own unit, token totals per scenario, and merges worker reports.
- The CSV, the HTML section, the summary table and the verdict carry those
  numbers with their units.
"""

from __future__ import annotations

import csv
import json
import math
import random

import moss_vl_stats as s
import pytest


def nearest_rank(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_percentiles_match_the_raw_samples_to_three_digits(seed):
    rnd = random.Random(seed)
    samples = [rnd.lognormvariate(3, 1.2) for _ in range(2000)]  # ms, 1..1000s of ms
    d = s.Distribution()
    for x in samples:
        d.add(x)
    for q in (0.5, 0.9, 0.95, 0.99):
        want = nearest_rank(samples, q)
        assert d.percentile(q) == pytest.approx(want, rel=0.0005), q
    assert d.count == 2000 and d.min == min(samples) and d.max == max(samples)
    assert d.mean == pytest.approx(sum(samples) / len(samples))


def test_a_value_near_a_threshold_keeps_its_digits():
    d = s.Distribution()
    for x in [2996.0] * 20:
        d.add(x)
    assert d.percentile(0.95) == 2996.0


def test_merge_equals_one_distribution_and_the_wire_round_trips():
    rnd = random.Random(7)
    a, b, both = s.Distribution(), s.Distribution(), s.Distribution()
    for i in range(500):
        x = rnd.uniform(1, 500)
        (a if i % 3 else b).add(x)
        both.add(x)
    merged = s.Distribution.from_wire(json.loads(json.dumps(a.to_wire())))
    merged.merge(s.Distribution.from_wire(b.to_wire()))
    assert merged.counts == both.counts and merged.count == both.count
    assert merged.percentile(0.95) == both.percentile(0.95)
    assert (merged.min, merged.max) == (both.min, both.max)
    assert s.Distribution().percentile(0.5) is None


def test_llm_stats_per_scenario_and_merged_across_workers():
    worker1, worker2, master = s.LLMStats(), s.LLMStats(), s.LLMStats()
    worker1.record("text", {"TTFT": 100.0, "ITL": [10.0, 12.0], "E2E": 130.0}, 20, 3)
    worker2.record("text", {"TTFT": 300.0, "ITL": [30.0], "E2E": 340.0}, 20, 2)
    worker2.record("single_image", {"TTFT": 500.0, "TOKENS_PER_S": 40.0}, 300, 8)
    worker2.arrivals, worker2.arrivals_dropped = 3, 1
    for w in (worker1, worker2):
        master.merge_wire(json.loads(json.dumps(w.to_wire())))
    assert master.get("text", "TTFT").count == 2
    assert master.get("text", "ITL").count == 3
    assert master.get(s.ALL, "TTFT").count == 3
    assert master.get(s.ALL, "OUTPUT_TOKENS").total == 13
    assert master.output_tokens == {"text": 5, "single_image": 8}
    assert master.prompt_tokens == {"text": 40, "single_image": 300}
    assert (master.arrivals, master.arrivals_dropped) == (3, 1)
    with pytest.raises(ValueError, match="metric 'TTFB'"):
        master.add("text", "TTFB", 1.0)


def test_reports_carry_units(tmp_path):
    st = s.LLMStats()
    st.record("text", {"TTFT": 120.0, "ITL": [20.0, 22.0], "TOKENS_PER_S": 25.0}, 10, 3)
    path = tmp_path / "x_llm_stats.csv"
    s.write_csv(st, str(path))
    rows = list(csv.DictReader(path.open()))
    units = {(r["Scenario"], r["Metric"]): r["Unit"] for r in rows}
    assert units[("text", "TTFT")] == "ms" and units[("all", "TOKENS_PER_S")] == "tok/s"
    assert units[("text", "OUTPUT_TOKENS")] == "tokens"
    itl = next(r for r in rows if r["Scenario"] == "text" and r["Metric"] == "ITL")
    assert itl["Count"] == "2" and float(itl["Max"]) == 22.0
    rows_by = {"text": s.ScenarioRow("text", 4, 1)}
    lines = s.summary_lines(st, rows_by, 2.0, "head")
    assert lines[0] == "head" and lines[2].split()[:4] == ["text", "4", "1", "2.00"]
    assert "120 ms" in lines[2] and lines[-1].startswith("all")
    html = tmp_path / "r.html"
    html.write_text('<body><div id="root"></div></body>')
    s.add_to_html_report(str(html), s.html_section(st, None))
    text = html.read_text()
    assert text.index("moss-vl-llm-stats") < text.index('<div id="root">')
    assert "<td>tok/s</td>" in text


def test_format_seconds():
    assert s.format_seconds(0.0123) == "12.3 ms"
    assert s.format_seconds(0.01) == "10 ms"
    assert s.format_seconds(1.2345) == "1.23 s"
    assert s.format_seconds(3.0) == "3 s"
