#!/usr/bin/env python3
"""The Grafana dashboard of llm-filter's metrics, written from this one
description so its queries stay true to the metrics (`make examples`).

    dashboard.py            write examples/grafana/llm-filter.json
    dashboard.py --check    fail when the file differs from what this writes,
                            when a query names a metric docs/metrics.md does
                            not list (or a recording rule the rules file does
                            not record), or when promtool refuses a query
"""

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "examples" / "grafana" / "llm-filter.json"
METRICS_DOC = ROOT / "docs" / "metrics.md"
RULES = ROOT / "examples" / "prometheus" / "llm-filter.rules.yaml"

SEL = 'model=~"$model", instance=~"$instance"'
NODE = 'instance=~"$instance"'
BACKEND = 'llm_cluster=~"$llm_cluster", instance=~"$instance"'
GROUP = 'group=~"$group"'
R = "$__rate_interval"
# What the providers' prompt caches saved and their writes cost above the
# input rate, per model, in the price unit per hour (docs/metrics.md).
SAVED = f"sum by (model) (rate(llm_filter_prompt_cache_saved_micros_total{{{SEL}}}[{R}])) * 3600 / 1e6"
PREMIUM = f"sum by (model) (rate(llm_filter_prompt_cache_write_premium_micros_total{{{SEL}}}[{R}])) * 3600 / 1e6"

# (row, [(title, kind, unit, [(expr, legend)])]); kind: timeseries, stat, heatmap
# (Prometheus buckets), status-history (one row per series, colour = value).
ROWS = [
    ("Traffic", [
        ("Calls per second by model", "timeseries", "reqps",
         [(f"sum by (model) (rate(llm_filter_requests_total{{{SEL}}}[{R}]))", "{{model}}")]),
        ("Calls per second by outcome", "timeseries", "reqps",
         [(f"sum by (outcome) (rate(llm_filter_requests_total{{{SEL}}}[{R}]))", "{{outcome}}")]),
        ("Error ratio by model (5 min)", "timeseries", "percentunit",
         [('llm:error_ratio:rate5m{model=~"$model"}', "{{model}}")]),
        ("Tokens per second by type", "timeseries", "short",
         [(f"sum by (token_type) (rate(gen_ai_client_token_usage_total{{{SEL}}}[{R}]))", "{{token_type}}")]),
    ]),
    ("Latency", [
        ("Call duration P50 / P95 / P99", "timeseries", "ms",
         [(f"histogram_quantile({q}, sum by (le) (rate(gen_ai_client_operation_duration_ms_bucket{{{SEL}}}[{R}])))", f"P{int(q * 100)}")
          for q in (0.5, 0.95, 0.99)]),
        ("Time to first token P95 by model", "timeseries", "ms",
         [(f"histogram_quantile(0.95, sum by (le, model) (rate(gen_ai_server_time_to_first_token_ms_bucket{{{SEL}}}[{R}])))", "{{model}}")]),
        ("Time per output token P95 by model", "timeseries", "µs",
         [(f"histogram_quantile(0.95, sum by (le, model) (rate(gen_ai_server_time_per_output_token_us_bucket{{{SEL}}}[{R}])))", "{{model}}")]),
        ("Call duration heatmap, per node", "heatmap", "ms",
         [(f"sum by (le) (rate(gen_ai_client_operation_duration_ms_bucket{{{SEL}}}[{R}]))", "{{le}}")]),
        ("P95 of each try by backend", "status-history", "ms",
         [(f"histogram_quantile(0.95, sum by (le, llm_cluster) (rate(llm_filter_routing_call_duration_ms_bucket{{{BACKEND}}}[{R}])))", "{{llm_cluster}}")]),
    ]),
    ("Cache", [
        ("Hit ratio", "stat", "percentunit",
         [("llm:cache_hit_ratio:rate5m", "hit ratio")]),
        ("Hit ratio by kind", "timeseries", "percentunit",
         [(f'sum by (result) (rate(llm_filter_cache_lookups_total{{result=~"hit|coalesced|stale|semantic", {NODE}}}[{R}])) / ignoring (result) group_left sum(rate(llm_filter_cache_lookups_total{{result!="bypass", {NODE}}}[{R}]))', "{{result}}")]),
        ("Lookups by result", "timeseries", "ops",
         [(f"sum by (result) (rate(llm_filter_cache_lookups_total{{{NODE}}}[{R}]))", "{{result}}")]),
        ("Entries and bytes", "timeseries", "short",
         [(f"sum(llm_filter_cache_entries{{{NODE}}})", "entries"),
          (f"sum(llm_filter_cache_bytes{{{NODE}}})", "bytes")]),
        ("Prompt-cache input tokens read, share of input", "timeseries", "percentunit",
         [(f'sum by (model) (rate(gen_ai_client_token_usage_total{{token_type="cached_input", {SEL}}}[{R}])) / sum by (model) (rate(gen_ai_client_token_usage_total{{token_type="input", {SEL}}}[{R}]))', "{{model}}")]),
        ("Prompt-cache tokens read and written per second", "timeseries", "short",
         [(f'sum by (model, token_type) (rate(gen_ai_client_token_usage_total{{token_type=~"cached_input|cache_creation_input", {SEL}}}[{R}]))', "{{model}} {{token_type}}")]),
        ("Prompt-cache saving per hour by model, net of writes", "timeseries", "short",
         [(f"({SAVED} or {PREMIUM} * 0) - ({PREMIUM} or {SAVED} * 0)", "{{model}}")]),
        ("Shard keys by result", "timeseries", "ops",
         [(f"sum by (result) (rate(llm_filter_cache_shard_keys_total{{{NODE}}}[{R}]))", "{{result}}")]),
    ]),
    ("Routing", [
        ("Effective weight by backend", "timeseries", "short",
         [(f'max by (model, llm_cluster) (llm_filter_routing_weight_milli{{{SEL}, llm_cluster=~"$llm_cluster"}}) / 1000', "{{model}} → {{llm_cluster}}")]),
        ("Tries by backend and outcome", "timeseries", "ops",
         [(f"sum by (llm_cluster, outcome) (rate(llm_filter_routing_calls_total{{{BACKEND}}}[{R}]))", "{{llm_cluster}} {{outcome}}")]),
        ("Ejections, hedges and failovers", "timeseries", "ops",
         [(f"sum by (llm_cluster) (rate(llm_filter_routing_ejections_total{{{BACKEND}}}[{R}]))", "ejected {{llm_cluster}}"),
          (f"sum by (result) (rate(llm_filter_routing_hedges_total{{{NODE}}}[{R}]))", "hedge {{result}}"),
          (f"sum by (result) (rate(llm_filter_routing_failovers_total{{{NODE}}}[{R}]))", "failover {{result}}")]),
        ("Calls in flight by backend", "timeseries", "short",
         [(f"sum by (llm_cluster) (llm_filter_routing_in_flight{{{BACKEND}}})", "{{llm_cluster}}")]),
    ]),
    ("Budgets and degrade", [
        ("Breaker tier by backend", "timeseries", "short",
         [(f"max by (llm_cluster) (llm_filter_budget_breaker_tier{{{BACKEND}}})", "{{llm_cluster}}")]),
        ("Breaker pressure by backend", "timeseries", "percentunit",
         [(f"max by (llm_cluster) (llm_filter_budget_breaker_pressure_permille{{{BACKEND}}}) / 1000", "{{llm_cluster}}")]),
        ("Shed and rejected by the breaker", "timeseries", "ops",
         [(f"sum by (priority) (rate(llm_filter_budget_shed_total{{{NODE}}}[{R}]))", "shed {{priority}}"),
          (f"sum by (priority) (rate(llm_filter_budget_rejected_total{{{NODE}}}[{R}]))", "rejected {{priority}}")]),
        ("Degrade level by model", "timeseries", "short",
         [(f"max by (model) (llm_filter_degrade_level{{{SEL}}})", "{{model}}")]),
        ("Degrade actions", "timeseries", "ops",
         [(f"sum by (action, priority) (rate(llm_filter_degraded_total{{{NODE}}}[{R}]))", "{{action}} {{priority}}")]),
        ("Degrade sources: pulls by result", "timeseries", "ops",
         [(f"sum by (what, result) (rate(llm_filter_degrade_pulls_total{{{NODE}}}[{R}]))", "{{what}} {{result}}")]),
        ("Degrade sources up (proxies)", "stat", "short",
         [(f"sum by (what) (llm_filter_degrade_source_up{{{NODE}}})", "{{what}}")]),
        ("Mesh-wide load by model", "timeseries", "reqps",
         [('llm:load_rps:sum{model=~"$model"}', "{{model}}")]),
    ]),
    ("A/B groups", [
        ("Calls per second by group", "timeseries", "reqps",
         [(f'sum by (group) (rate(llm_filter_requests_total{{group!="", {GROUP}, {SEL}}}[{R}]))', "{{group}}")]),
        ("Call duration P95 by group (5 min)", "timeseries", "ms",
         [(f"llm:group_duration_ms:p95_5m{{{GROUP}}}", "{{group}}")]),
        ("Failed or cut share by group (5 min)", "timeseries", "percentunit",
         [(f"llm:group_error_ratio:rate5m{{{GROUP}}}", "{{group}}")]),
        ("Tokens per call by group (5 min)", "timeseries", "short",
         [(f"llm:group_tokens_per_call:rate5m{{{GROUP}}}", "{{group}} {{token_type}}")]),
    ]),
    ("Limits", [
        ("Calls under limit rules by result", "timeseries", "ops",
         [(f"sum by (rule, result) (rate(llm_filter_limits_calls_total{{{NODE}}}[{R}]))", "{{rule}} {{result}}")]),
        ("Tokens charged per second by tenant", "timeseries", "short",
         [(f"sum by (rule, tenant) (rate(llm_filter_limits_tokens_total{{{NODE}}}[{R}]))", "{{rule}} {{tenant}}")]),
        ("Cost charged per hour by tenant", "timeseries", "short",
         [(f"sum by (rule, tenant) (rate(llm_filter_limits_cost_micros_total{{{NODE}}}[{R}])) * 3600 / 1e6", "{{rule}} {{tenant}}")]),
        ("Share of each limit used (top tenants)", "timeseries", "percentunit",
         [(f"topk(10, max by (rule, tenant, limit) (llm_filter_limits_used_permille{{{NODE}}})) / 1000", "{{rule}} {{tenant}} {{limit}}")]),
    ]),
    ("The filter itself", [
        ("Internal errors by reason", "timeseries", "ops",
         [(f"sum by (reason) (rate(llm_filter_internal_errors_total{{{NODE}}}[{R}]))", "{{reason}}")]),
        ("Shared data", "timeseries", "short",
         [(f"max by (instance) (llm_filter_shared_data_keys{{{NODE}}})", "keys {{instance}}"),
          (f"max by (instance) (llm_filter_shared_data_bytes{{{NODE}}})", "bytes {{instance}}")]),
        ("Spans by result", "timeseries", "ops",
         [(f"sum by (result) (rate(llm_filter_spans_total{{{NODE}}}[{R}]))", "{{result}}")]),
        ("Spans waiting for export", "timeseries", "short",
         [(f"sum(llm_filter_spans_queued{{{NODE}}})", "queued")]),
    ]),
]


def panel(pid, title, kind, unit, targets, x, y):
    p = {
        "id": pid,
        "type": kind,
        "title": title,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"h": 8, "w": 6, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "targets": [
            {"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend,
             **({"format": "heatmap"} if kind == "heatmap" else {})}
            for i, (expr, legend) in enumerate(targets)
        ],
    }
    if kind == "heatmap":
        p["options"] = {"calculate": False, "yAxis": {"unit": unit}}
    if kind == "status-history":
        # Time across, a row per backend, the colour its P95: the heatmap
        # per backend.
        p["fieldConfig"]["defaults"]["color"] = {"mode": "continuous-GrYlRd"}
        p["options"] = {"showValue": "never", "rowHeight": 0.9}
    return p


def variable(name, query):
    return {
        "name": name, "type": "query", "label": name,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "query": {"query": query, "refId": name},
        "includeAll": True, "multi": True, "allValue": ".*",
        "current": {"text": "All", "value": "$__all"}, "refresh": 2,
    }


def dashboard():
    panels, pid, y = [], 1, 0
    for row, items in ROWS:
        panels.append({"id": pid, "type": "row", "title": row, "collapsed": False,
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})
        pid, y = pid + 1, y + 1
        for i, (title, kind, unit, targets) in enumerate(items):
            x = (i % 4) * 6
            if i and i % 4 == 0:
                y += 8
            panels.append(panel(pid, title, kind, unit, targets, x, y))
            pid += 1
        y += 8
    return {
        "title": "llm-filter",
        "uid": "llm-filter",
        "description": "LLM calls through llm-filter: traffic, latency, cache, routing, budgets, degrade and the filter itself (docs/metrics.md).",
        "tags": ["llm", "envoy", "llm-filter"],
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "30s",
        "templating": {"list": [
            {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"},
            variable("model", "label_values(llm_filter_requests_total, model)"),
            variable("instance", "label_values(llm_filter_requests_total, instance)"),
            variable("llm_cluster", "label_values(llm_filter_routing_calls_total, llm_cluster)"),
            variable("group", "label_values(llm_filter_requests_total, group)"),
        ]},
        "panels": panels,
    }


def render():
    return json.dumps(dashboard(), indent=2, ensure_ascii=False) + "\n"


def exprs():
    for _, items in ROWS:
        for _, _, _, targets in items:
            for expr, _ in targets:
                yield expr


def check():
    problems = []
    if not OUT.exists() or OUT.read_text() != render():
        problems.append(f"{OUT.relative_to(ROOT)} is not what scripts/dashboard.py writes: run it")
    documented = set(re.findall(r"^\| `([a-z_]+)` \|", METRICS_DOC.read_text(), re.M))
    recorded = set(re.findall(r"^\s*- record: (\S+)", RULES.read_text(), re.M))
    names = re.compile(r"\b(llm:[a-z_:0-9]+|llm_filter_[a-z_]+|gen_ai_[a-z_]+)")
    for expr in exprs():
        for name in names.findall(expr):
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            if name.startswith("llm:"):
                if name not in recorded:
                    problems.append(f"{name}: no such recording rule in {RULES.name}")
            elif base not in documented and name not in documented:
                problems.append(f"{name}: not a metric of docs/metrics.md")
    # promtool parses every query (Grafana's variables given values).
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        rules = [{"record": f"dashboard:query{i}", "expr": e.replace("$__rate_interval", "5m")
                  .replace("$model", ".*").replace("$instance", ".*")
                  .replace("$llm_cluster", ".*").replace("$group", ".*")}
                 for i, e in enumerate(exprs())]
        json.dump({"groups": [{"name": "dashboard", "rules": rules}]}, f)
    r = subprocess.run(["promtool", "check", "rules", f.name], capture_output=True, text=True)
    Path(f.name).unlink()
    if r.returncode != 0:
        problems.append(f"promtool refuses a query:\n{r.stdout}{r.stderr}")
    for p in problems:
        print(p, file=sys.stderr)
    print(f"dashboard: {sum(1 for _ in exprs())} queries, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--check"]:
        sys.exit(check())
    OUT.write_text(render())
