"""Alert rules in YAML, Prometheus-rule-like, parsed into frozen dataclasses with clear errors.

```yaml
groups:
  - name: fleet
    rules:
      - alert: HostCpuHigh                       # static threshold
        expr: 'utilization{resource="cpu"} > 0.9'
        for: 5m
        severity: critical
        annotations: {summary: "CPU above 90%"}
      - alert: QueueWaitUnusual                  # dynamic baseline: EWMA +/- k sigma
        baseline: {metric: 'queue_wait_seconds', method: ewma, alpha: 0.1, k: 4}
      - alert: CpuOffSeason                      # dynamic baseline: seasonal rolling baseline
        baseline: {metric: 'utilization{resource="cpu"}', method: seasonal, period: 1d, seasons: 7, k: 4}
      - alert: PoolAnomaly                       # multi-metric: IsolationForest per pool, retrained
        anomaly: {metrics: ['utilization{resource="cpu"}', 'utilization{resource="memory"}'],
                  by: host, window: 7d, retrain: 6h, contamination: 0.01}
```

A spend anomaly is a baseline rule on ``spend_usd_per_hour``. A rule has exactly one of ``expr``,
``baseline`` or ``anomaly``. Durations are ``30s``, ``5m``, ``2h``, ``1d`` (or seconds as a number).
Every error is a :class:`broker.errors.SpecError` naming the field (``groups[0].rules[2].for``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from broker.errors import SpecError

__all__ = [
    "Selector", "StaticCondition", "Baseline", "Anomaly", "Rule", "RuleGroup", "parse_rules", "parse_selector",
    "parse_duration", "SEVERITIES",
]

SEVERITIES = ("info", "warning", "critical")
_OPS = (">=", "<=", "==", "!=", ">", "<")
_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_SELECTOR_RE = re.compile(rf"^\s*({_NAME})\s*(?:\{{(.*)\}})?\s*$")
_MATCHER_RE = re.compile(rf'^\s*({_NAME})\s*=\s*"([^"]*)"\s*$')
_EXPR_RE = re.compile(r"^(.*?)\s*(>=|<=|==|!=|>|<)\s*(-?[0-9.eE+]+)\s*$")
_DURATION_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(ms|s|m|h|d|w)?\s*$")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, None: 1}
_RULE_KEYS = {"alert", "expr", "baseline", "anomaly", "for", "severity", "labels", "annotations"}
_BASELINE_KEYS = {"metric", "method", "alpha", "k", "period", "seasons", "direction", "warmup", "minSigma"}
_ANOMALY_KEYS = {"metrics", "by", "window", "retrain", "contamination", "minSamples"}


@dataclass(frozen=True)
class Selector:
    """``name{k="v",...}``: a metric and the labels its series must have."""

    metric: str
    match: Mapping[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        inner = ",".join(f'{k}="{v}"' for k, v in sorted(self.match.items()))
        return f"{self.metric}{{{inner}}}" if inner else self.metric


@dataclass(frozen=True)
class StaticCondition:
    selector: Selector
    op: str
    threshold: float

    def holds(self, value: float) -> bool:
        return {
            ">": value > self.threshold, ">=": value >= self.threshold, "<": value < self.threshold,
            "<=": value <= self.threshold, "==": value == self.threshold, "!=": value != self.threshold,
        }[self.op]


@dataclass(frozen=True)
class Baseline:
    """A dynamic baseline: ``ewma`` (mean and variance exponentially weighted, ``alpha``) or ``seasonal``
    (median and MAD of the same phase in the last ``seasons`` periods of ``period_seconds``); a point
    outside ``k`` sigma (``direction``: above | below | both) is anomalous."""

    selector: Selector
    method: str = "ewma"
    alpha: float = 0.1
    k: float = 4.0
    period_seconds: float = 86400.0
    seasons: int = 7
    direction: str = "both"
    warmup: int = 20
    min_sigma: float = 1e-6


@dataclass(frozen=True)
class Anomaly:
    """Multi-metric anomaly detection with IsolationForest, one model per value of the label ``by``."""

    selectors: tuple[Selector, ...]
    by: str = "host"
    window_seconds: float = 7 * 86400.0
    retrain_seconds: float = 6 * 3600.0
    contamination: float = 0.01
    min_samples: int = 50


@dataclass(frozen=True)
class Rule:
    name: str
    condition: StaticCondition | Baseline | Anomaly
    for_seconds: float = 0.0
    severity: str = "warning"
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RuleGroup:
    name: str
    rules: tuple[Rule, ...]


def parse_duration(value: Any, where: str) -> float:
    """Seconds of ``30s`` / ``5m`` / ``2h`` / ``1d`` / ``1w`` / a number."""
    if isinstance(value, bool):
        raise SpecError(where, "expected a duration such as 30s, 5m, 2h or 1d")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        m = _DURATION_RE.match(str(value))
        if not m:
            raise SpecError(where, f"{value!r} is not a duration. To fix: write e.g. 30s, 5m, 2h or 1d")
        seconds = float(m.group(1)) * _UNITS[m.group(2)]
    if seconds < 0:
        raise SpecError(where, "a duration cannot be negative")
    return seconds


def parse_selector(text: Any, where: str) -> Selector:
    """``utilization{resource="cpu",host="h1"}`` -> :class:`Selector`."""
    if not isinstance(text, str):
        raise SpecError(where, 'expected a metric selector such as utilization{resource="cpu"}')
    m = _SELECTOR_RE.match(text)
    if not m:
        raise SpecError(where, f'{text!r} is not a metric selector. To fix: write name or name{{label="value"}}')
    match: dict[str, str] = {}
    if m.group(2) and m.group(2).strip():
        for part in m.group(2).split(","):
            mm = _MATCHER_RE.match(part)
            if not mm:
                raise SpecError(where, f'{part.strip()!r}: only label="value" matchers are supported')
            match[mm.group(1)] = mm.group(2)
    return Selector(m.group(1), match)


def _mapping(value: Any, where: str, allowed: set[str]) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise SpecError(where, f"expected a mapping, got {type(value).__name__}")
    unknown = sorted(set(map(str, value)) - allowed)
    if unknown:
        raise SpecError(f"{where}.{unknown[0]}", f"unknown field. To fix: use one of {', '.join(sorted(allowed))}")
    return value


def _number(value: Any, where: str, lo: float, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SpecError(where, f"expected a number, got {value!r}")
    if not lo <= float(value) <= hi:
        raise SpecError(where, f"{value} is out of range [{lo:g}, {hi:g}]")
    return float(value)


def _str_map(value: Any, where: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise SpecError(where, "expected a mapping of strings")
    return {str(k): str(v) for k, v in value.items()}


def _condition(r: Mapping[str, Any], w: str) -> StaticCondition | Baseline | Anomaly:
    given = [k for k in ("expr", "baseline", "anomaly") if k in r]
    if len(given) != 1:
        raise SpecError(w, "a rule needs exactly one of expr, baseline or anomaly")
    if "expr" in r:
        expr = r["expr"]
        m = _EXPR_RE.match(expr) if isinstance(expr, str) else None
        if not m:
            raise SpecError(f"{w}.expr", f"{expr!r} is not '<selector> <op> <number>' (op one of {', '.join(_OPS)})")
        try:
            threshold = float(m.group(3))
        except ValueError:
            raise SpecError(f"{w}.expr", f"{m.group(3)!r} is not a number") from None
        return StaticCondition(parse_selector(m.group(1), f"{w}.expr"), m.group(2), threshold)
    if "baseline" in r:
        b = _mapping(r["baseline"], f"{w}.baseline", _BASELINE_KEYS)
        if "metric" not in b:
            raise SpecError(f"{w}.baseline.metric", "required")
        method = b.get("method", "ewma")
        if method not in ("ewma", "seasonal"):
            raise SpecError(f"{w}.baseline.method", f"{method!r}: use ewma or seasonal")
        direction = b.get("direction", "both")
        if direction not in ("above", "below", "both"):
            raise SpecError(f"{w}.baseline.direction", f"{direction!r}: use above, below or both")
        return Baseline(
            selector=parse_selector(b["metric"], f"{w}.baseline.metric"),
            method=method,
            alpha=_number(b.get("alpha", 0.1), f"{w}.baseline.alpha", 0.0001, 1.0),
            k=_number(b.get("k", 4.0), f"{w}.baseline.k", 0.1, 100.0),
            period_seconds=parse_duration(b.get("period", "1d"), f"{w}.baseline.period"),
            seasons=int(_number(b.get("seasons", 7), f"{w}.baseline.seasons", 1, 365)),
            direction=direction,
            warmup=int(_number(b.get("warmup", 20), f"{w}.baseline.warmup", 1, 100_000)),
            min_sigma=_number(b.get("minSigma", 1e-6), f"{w}.baseline.minSigma", 0.0, 1e12),
        )
    a = _mapping(r["anomaly"], f"{w}.anomaly", _ANOMALY_KEYS)
    metrics = a.get("metrics")
    if not isinstance(metrics, list) or not metrics:
        raise SpecError(f"{w}.anomaly.metrics", "expected a non-empty list of metric selectors")
    by = a.get("by", "host")
    if not isinstance(by, str) or not re.fullmatch(_NAME, by):
        raise SpecError(f"{w}.anomaly.by", f"{by!r} is not a label name")
    return Anomaly(
        selectors=tuple(parse_selector(s, f"{w}.anomaly.metrics[{i}]") for i, s in enumerate(metrics)),
        by=by,
        window_seconds=parse_duration(a.get("window", "7d"), f"{w}.anomaly.window"),
        retrain_seconds=parse_duration(a.get("retrain", "6h"), f"{w}.anomaly.retrain"),
        contamination=_number(a.get("contamination", 0.01), f"{w}.anomaly.contamination", 0.0001, 0.5),
        min_samples=int(_number(a.get("minSamples", 50), f"{w}.anomaly.minSamples", 10, 10**7)),
    )


def parse_rules(text: str | Mapping[str, Any]) -> list[RuleGroup]:
    """Parse a rules document (YAML text or an already loaded mapping); raises SpecError on any mistake."""
    if isinstance(text, str):
        from broker.spec import load_documents  # bounded (no YAML bombs), duplicate keys refused

        docs = load_documents(text)
        if len(docs) > 1:
            raise SpecError("", f"expected one rules document, got {len(docs)}. To fix: one document per PUT/file")
        doc = docs[0] if docs else None
    else:
        doc = text
    top = _mapping(doc, "(document)", {"groups"})
    groups = top.get("groups")
    if not isinstance(groups, list) or not groups:
        raise SpecError("groups", "expected a non-empty list of rule groups")
    out: list[RuleGroup] = []
    names: set[str] = set()
    for gi, g in enumerate(groups):
        gw = f"groups[{gi}]"
        gm = _mapping(g, gw, {"name", "rules", "interval"})
        gname = gm.get("name")
        if not isinstance(gname, str) or not gname:
            raise SpecError(f"{gw}.name", "required: a non-empty string")
        rules = gm.get("rules")
        if not isinstance(rules, list) or not rules:
            raise SpecError(f"{gw}.rules", "expected a non-empty list of rules")
        parsed: list[Rule] = []
        for ri, r in enumerate(rules):
            w = f"{gw}.rules[{ri}]"
            rm = _mapping(r, w, _RULE_KEYS)
            name = rm.get("alert")
            if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z][A-Za-z0-9_:-]{0,127}", name):
                raise SpecError(f"{w}.alert", "required: a name of letters, digits, '_', ':' or '-'")
            if name in names:
                raise SpecError(f"{w}.alert", f"{name!r} is defined twice")
            names.add(name)
            severity = rm.get("severity", "warning")
            if severity not in SEVERITIES:
                raise SpecError(f"{w}.severity", f"{severity!r}: use one of {', '.join(SEVERITIES)}")
            parsed.append(Rule(
                name=name,
                condition=_condition(rm, w),
                for_seconds=parse_duration(rm.get("for", 0), f"{w}.for"),
                severity=severity,
                labels=_str_map(rm.get("labels"), f"{w}.labels"),
                annotations=_str_map(rm.get("annotations"), f"{w}.annotations"),
            ))
        out.append(RuleGroup(gname, tuple(parsed)))
    return out
