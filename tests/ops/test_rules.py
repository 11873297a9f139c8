"""Alert rule documents: the example parses to the right conditions; each mistake is one clear SpecError."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.errors import SpecError
from broker.ops.rules import Anomaly, Baseline, StaticCondition, parse_duration, parse_rules

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "alerts" / "fleet.yaml"


def test_the_example_rules_parse_to_their_conditions() -> None:
    groups = parse_rules(EXAMPLE.read_text())
    rules = {r.name: r for g in groups for r in g.rules}
    cpu = rules["HostCpuSaturated"]
    assert isinstance(cpu.condition, StaticCondition)
    assert cpu.condition.selector.match == {"scope": "host", "resource": "cpu"}
    assert cpu.condition.op == ">=" and cpu.condition.threshold == 0.95
    assert cpu.for_seconds == 600 and cpu.severity == "critical"
    season = rules["CpuOffSeason"].condition
    assert isinstance(season, Baseline) and season.method == "seasonal" and season.period_seconds == 86400
    forest = rules["HostBehavesOddly"].condition
    assert isinstance(forest, Anomaly) and forest.by == "host" and len(forest.selectors) == 2
    assert forest.retrain_seconds == 6 * 3600
    assert isinstance(rules["SpendAnomaly"].condition, Baseline)


@pytest.mark.parametrize("text,field", [
    ("groups: [", "malformed YAML at line 1"),
    ("groups: [{name: g, rules: [{alert: A, expr: 'cpu > 1'}]}]\ngroups: []", "duplicate key 'groups' at line 2"),
    ("- 1", "(document)"),
    ("groups: []", "groups"),
    ("groups: [{name: g, rules: [{alert: A}]}]", "groups[0].rules[0]"),
    ("groups: [{name: g, rules: [{alert: A, expr: 'cpu >'}]}]", "groups[0].rules[0].expr"),
    ("groups: [{name: g, rules: [{alert: A, expr: 'cpu > 1', for: soon}]}]", "groups[0].rules[0].for"),
    ("groups: [{name: g, rules: [{alert: A, expr: 'cpu > 1', severity: page}]}]", "severity"),
    ("groups: [{name: g, rules: [{alert: A, expr: 'cpu > 1', fro: 5m}]}]", "groups[0].rules[0].fro"),
    ("groups: [{name: g, rules: [{alert: A, baseline: {metric: cpu, method: prophet}}]}]", "baseline.method"),
    ("groups: [{name: g, rules: [{alert: A, anomaly: {metrics: []}}]}]", "anomaly.metrics"),
    ("groups: [{name: g, rules: [{alert: A, expr: 'x > 1'}, {alert: A, expr: 'y > 1'}]}]", "defined twice"),
    ("groups: [{name: g, rules: [{alert: A, expr: 'cpu{host=h1} > 1'}]}]", 'label="value"'),
], ids=["yaml", "duplicate-key", "not-a-mapping", "no-groups", "no-condition", "bad-expr", "bad-for", "bad-severity",
        "unknown-key", "bad-method", "empty-metrics", "duplicate", "unquoted-matcher"])
def test_a_bad_rules_document_is_one_clear_error(text: str, field: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_rules(text)
    assert field in str(info.value)


def test_durations() -> None:
    assert [parse_duration(x, "f") for x in ("30s", "5m", "2h", "1d", 90, "1.5h")] == [30, 300, 7200, 86400, 90, 5400]
    with pytest.raises(SpecError):
        parse_duration("-5m", "f")
