"""The load test's own statistics: TTFT, ITL, TPOT, E2E and throughput, each in
its own unit, kept apart from Locust's request statistics (which count HTTP
requests only), merged across distributed workers, and written as a CSV, a
section of the HTML report, a console summary and a JSON verdict.

Standard library only (the chart mounts this file next to the locustfile in a
stock Locust image), and testable without Locust.

A `Distribution` keeps every sample rounded to four significant digits
(0.05 % relative error at most), as value -> count, so percentiles are exact
to that precision whatever the spread (Locust's own response-time buckets
round 2996 ms to 3000 ms, which fails a 3 s gate), and two distributions
merge by adding counts: a worker ships its samples since the last report, the
master adds them up.
"""

from __future__ import annotations

import csv
import html
import json
import math
from dataclasses import dataclass, field

# name -> (unit, what one sample is). Latencies in ms, throughput in tokens/s.
METRICS = {
    "TTFT": ("ms", "time to first token: request sent to the first chunk with text"),
    "ITL": ("ms", "inter-token latency: one sample per gap between chunks with text"),
    "TPOT": ("ms", "time per output token after the first, per request"),
    "E2E": ("ms", "request sent to the last byte (data: [DONE])"),
    "TOKENS_PER_S": ("tok/s", "output tokens / E2E seconds, per request"),
    "OUTPUT_TOKENS": ("tokens", "output tokens per request (usage.completion_tokens)"),
}
PERCENTILES = (0.5, 0.9, 0.95, 0.99)
ALL = "all"  # the row merging every scenario


def _round_digits(value: float, digits: int = 4) -> float:
    """`value` to `digits` significant digits (0 stays 0)."""
    if value == 0 or not math.isfinite(value):
        return value
    return round(value, digits - 1 - int(math.floor(math.log10(abs(value)))))


@dataclass
class Distribution:
    """Samples as rounded value -> count, with exact count, sum, min and max."""

    counts: dict[float, int] = field(default_factory=dict)
    count: int = 0
    total: float = 0.0
    min: float = math.inf
    max: float = -math.inf

    def add(self, value: float) -> None:
        key = _round_digits(float(value))
        self.counts[key] = self.counts.get(key, 0) + 1
        self.count += 1
        self.total += value
        self.min = min(self.min, value)
        self.max = max(self.max, value)

    def merge(self, other: Distribution) -> None:
        for key, n in other.counts.items():
            self.counts[key] = self.counts.get(key, 0) + n
        self.count += other.count
        self.total += other.total
        self.min = min(self.min, other.min)
        self.max = max(self.max, other.max)

    @property
    def mean(self) -> float | None:
        return self.total / self.count if self.count else None

    def percentile(self, q: float) -> float | None:
        """Nearest rank: the smallest value with at least q of the samples at or below it."""
        if not self.count:
            return None
        rank = max(1, math.ceil(q * self.count))
        seen = 0
        for value in sorted(self.counts):
            seen += self.counts[value]
            if seen >= rank:
                return value
        return self.max

    def to_wire(self) -> list:
        return [
            [[k, n] for k, n in self.counts.items()],
            self.count,
            self.total,
            self.min,
            self.max,
        ]

    @classmethod
    def from_wire(cls, data: list) -> Distribution:
        pairs, count, total, lo, hi = data
        return cls({float(k): int(n) for k, n in pairs}, int(count), float(total), lo, hi)

    def summary(self) -> dict:
        out = {"count": self.count}
        if self.count:
            out.update(
                {
                    "mean": self.mean,
                    "min": self.min,
                    **{f"p{round(q * 100)}": self.percentile(q) for q in PERCENTILES},
                    "max": self.max,
                }
            )
        return out


class LLMStats:
    """Per scenario: a Distribution per metric, token totals; run-wide arrival counts."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.dists: dict[tuple[str, str], Distribution] = {}
        self.prompt_tokens: dict[str, int] = {}
        self.output_tokens: dict[str, int] = {}
        self.arrivals = 0
        self.arrivals_dropped = 0

    def add(self, scenario: str, metric: str, value: float) -> None:
        if metric not in METRICS:
            raise ValueError(f"metric {metric!r}: expected one of {', '.join(METRICS)}")
        self.dists.setdefault((scenario, metric), Distribution()).add(value)

    def record(
        self, scenario: str, metrics: dict, prompt_tokens: int | None, output_tokens: int | None
    ) -> None:
        """One successful generation: its metrics (a list for ITL) and its token counts."""
        for metric, value in metrics.items():
            for sample in value if isinstance(value, list) else (value,):
                self.add(scenario, metric, sample)
        if output_tokens is not None:
            self.add(scenario, "OUTPUT_TOKENS", output_tokens)
            self.output_tokens[scenario] = self.output_tokens.get(scenario, 0) + output_tokens
        if prompt_tokens is not None:
            self.prompt_tokens[scenario] = self.prompt_tokens.get(scenario, 0) + prompt_tokens

    # ---- workers -> master ------------------------------------------------------

    def to_wire(self) -> dict:
        return {
            "dists": [[s, m, d.to_wire()] for (s, m), d in self.dists.items()],
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "arrivals": self.arrivals,
            "arrivals_dropped": self.arrivals_dropped,
        }

    def merge_wire(self, data: dict) -> None:
        for scenario, metric, wire in data["dists"]:
            self.dists.setdefault((scenario, metric), Distribution()).merge(
                Distribution.from_wire(wire)
            )
        for name, target in (
            ("prompt_tokens", self.prompt_tokens),
            ("output_tokens", self.output_tokens),
        ):
            for scenario, n in data[name].items():
                target[scenario] = target.get(scenario, 0) + n
        self.arrivals += data["arrivals"]
        self.arrivals_dropped += data["arrivals_dropped"]

    # ---- views ------------------------------------------------------------------

    def scenarios(self) -> list[str]:
        return sorted({s for s, _m in self.dists})

    def get(self, scenario: str, metric: str) -> Distribution:
        """One scenario's distribution, or every scenario merged for `ALL`."""
        if scenario != ALL:
            return self.dists.get((scenario, metric), Distribution())
        merged = Distribution()
        for (_s, m), d in self.dists.items():
            if m == metric:
                merged.merge(d)
        return merged


# ---- reports -------------------------------------------------------------------


def format_value(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "ms":
        return format_seconds(value / 1000.0)
    if unit == "tok/s":
        return f"{value:.3g} tok/s" if value < 1000 else f"{value:,.0f} tok/s"
    return f"{value:.3g}"


def format_seconds(seconds: float) -> str:
    """A duration with a unit that keeps three significant digits: 12.3 ms, 1.25 s."""
    if seconds < 1.0:
        return f"{_round_digits(seconds * 1000.0, 3):g} ms"
    return f"{seconds:.3g} s" if seconds < 100 else f"{seconds:.0f} s"


@dataclass
class ScenarioRow:
    scenario: str
    requests: int
    failures: int


def csv_rows(stats: LLMStats) -> list[list[str]]:
    header = ["Scenario", "Metric", "Unit", "Count", "Mean", "Min"]
    header += [f"{round(q * 100)}%" for q in PERCENTILES] + ["Max"]
    rows = [header]
    for scenario in [*stats.scenarios(), ALL]:
        for metric, (unit, _what) in METRICS.items():
            d = stats.get(scenario, metric)
            if not d.count:
                continue
            values = [d.mean, d.min, *(d.percentile(q) for q in PERCENTILES), d.max]
            rows.append([scenario, metric, unit, str(d.count), *(f"{v:.6g}" for v in values)])
    return rows


def write_csv(stats: LLMStats, path: str) -> None:
    with open(path, "w", newline="") as fh:
        csv.writer(fh).writerows(csv_rows(stats))


def html_section(stats: LLMStats, verdict: dict | None) -> str:
    """A static HTML section for Locust's report: the LLM metrics and the gates."""
    rows = csv_rows(stats)
    head = "".join(f"<th>{html.escape(h)}</th>" for h in rows[0])
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows[1:]
    )
    gates = ""
    if verdict:
        lines = "".join(f"<li>{html.escape(g['line'])}</li>" for g in verdict["gates"])
        gates = (
            f"<p><b>Verdict: {html.escape(verdict['verdict'].upper())}</b> "
            f"(exit code {verdict['exit_code']})</p><ul>{lines}</ul>"
        )
    return (
        '<section id="moss-vl-llm-stats" style="font-family:sans-serif;margin:16px 24px">'
        "<h2>MOSS-VL: generation metrics (not HTTP requests; units per row)</h2>"
        f"{gates}"
        '<table style="border-collapse:collapse" border="1" cellpadding="4">'
        f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></section>"
    )


def add_to_html_report(path: str, section: str) -> None:
    """Put the section into Locust's HTML report, above its own (React) content."""
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    marker = '<div id="root"></div>'
    if marker not in text:
        text = text.replace("</body>", section + "</body>", 1)
    else:
        text = text.replace(marker, section + marker, 1)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)


def summary_lines(
    stats: LLMStats, requests: dict[str, ScenarioRow], duration_s: float, header: str
) -> list[str]:
    """The compact end-of-run table: one line per scenario, one for all."""
    cols = (
        f"{'scenario':<24}{'requests':>9}{'failed':>8}{'req/s':>8}"
        f"{'TTFT p50':>11}{'TTFT p95':>11}{'ITL p50':>10}{'ITL p95':>10}"
        f"{'TPOT p50':>10}{'E2E p95':>10}{'out tok/s':>11}"
    )
    lines = [header, cols]
    names = sorted(set(requests) | set(stats.scenarios()))
    totals = ScenarioRow(ALL, sum(r.requests for r in requests.values()), 0)
    totals.failures = sum(r.failures for r in requests.values())
    for name in [*names, ALL]:
        row = totals if name == ALL else requests.get(name, ScenarioRow(name, 0, 0))

        def p(metric, q, name=name):
            return format_value(stats.get(name, metric).percentile(q), "ms")

        out_tokens = (
            sum(stats.output_tokens.values()) if name == ALL else stats.output_tokens.get(name, 0)
        )
        rate = row.requests / duration_s if duration_s > 0 else 0.0
        tps = out_tokens / duration_s if duration_s > 0 else 0.0
        lines.append(
            f"{name:<24}{row.requests:>9}{row.failures:>8}{rate:>8.2f}"
            f"{p('TTFT', 0.5):>11}{p('TTFT', 0.95):>11}{p('ITL', 0.5):>10}{p('ITL', 0.95):>10}"
            f"{p('TPOT', 0.5):>10}{p('E2E', 0.95):>10}{tps:>11.1f}"
        )
    return lines


def verdict_document(
    *,
    stats: LLMStats,
    requests: dict[str, ScenarioRow],
    gates: list,
    exit_code: int,
    duration_s: float,
    run: dict,
    preflight: dict | None,
) -> dict:
    """The machine-readable verdict (written as JSON next to the reports)."""
    scenarios = {}
    for name in sorted(set(requests) | set(stats.scenarios())) + [ALL]:
        row = requests.get(name)
        if name == ALL:
            row = ScenarioRow(
                ALL,
                sum(r.requests for r in requests.values()),
                sum(r.failures for r in requests.values()),
            )
        row = row or ScenarioRow(name, 0, 0)
        doc = {"requests": row.requests, "failures": row.failures}
        for metric, (unit, _what) in METRICS.items():
            d = stats.get(name, metric)
            if d.count:
                doc[metric.lower()] = {"unit": unit, **d.summary()}
        scenarios[name] = doc
    output = sum(stats.output_tokens.values())
    prompt = sum(stats.prompt_tokens.values())
    total = scenarios[ALL]["requests"]
    return {
        "verdict": "fail" if any(g.failed for g in gates) else "pass",
        "exit_code": exit_code,
        **run,
        "duration_s": round(duration_s, 3),
        "preflight": preflight,
        "throughput": {
            "requests_per_s": total / duration_s if duration_s > 0 else 0.0,
            "output_tokens_per_s": output / duration_s if duration_s > 0 else 0.0,
            "prompt_tokens_per_s": prompt / duration_s if duration_s > 0 else 0.0,
            "output_tokens": output,
            "prompt_tokens": prompt,
        },
        "arrivals": {"sent": stats.arrivals, "dropped": stats.arrivals_dropped},
        "scenarios": scenarios,
        "gates": [{"name": g.name, "verdict": g.verdict, "line": g.line} for g in gates],
    }


def write_json(path: str, doc: dict) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=2, sort_keys=False)
        fh.write("\n")
