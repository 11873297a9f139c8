"""The alert engine: evaluates the stored rules over the metric history, keeps alert states in the store,
groups firing alerts along the topology with a root cause, and delivers them by signed webhook.

States follow Prometheus: a rule's condition true for a series -> ``pending``; true for ``for:`` ->
``firing``; false again -> ``resolved`` (a pending alert whose condition clears is dropped). One alert row
per rule x label set (its *fingerprint*) while not resolved.

Conditions (:mod:`broker.ops.rules`): a static threshold on each series' latest sample; a dynamic
baseline (EWMA or seasonal, :mod:`broker.ops.anomaly`) judged on the latest sample against the history
before it; an IsolationForest per value of the ``by`` label over several metrics aligned in time,
retrained every ``retrain`` of the clock (models live in this process and are trained again after a
restart). A series whose latest sample is older than ``stale_seconds`` is not judged.

Delivery: every alert that became firing or resolved is queued (``delivered`` false,
``next_delivery_at``); :meth:`AlertEngine.deliver` POSTs one signed payload per group, and a failed
attempt is retried at ``now + retry_delay_seconds(attempts)`` until ``max_attempts``.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import numpy as np
import sqlalchemy as sa

from broker.ops import anomaly
from broker.ops.rules import Anomaly, Baseline, Rule, StaticCondition, parse_rules
from broker.ops.samples import Series, label_key, parse_labels, read_series
from broker.ops.store import AlertRow, AlertRuleRow
from broker.ops.topology import Topology, group_alerts
from broker.ops.webhooks import WebhookSender, retry_delay_seconds
from broker.store import utc

__all__ = ["AlertEngine", "Finding", "EvaluationReport", "put_rules", "delete_rules", "list_alerts", "fingerprint"]

_alerts = AlertRow.__table__  # type: ignore[attr-defined]
_rules = AlertRuleRow.__table__  # type: ignore[attr-defined]


def fingerprint(rule: str, labels: Mapping[str, str]) -> str:
    return hashlib.sha256(f"{rule}\n{label_key(labels)}".encode()).hexdigest()[:32]


def put_rules(session: Any, name: str, yaml_text: str, now: datetime) -> int:
    """Validate and store a rules document under ``name`` (replacing it); returns its rule count.
    Raises :class:`broker.errors.SpecError` (and stores nothing) when invalid."""
    groups = parse_rules(yaml_text)
    existing = {r.name for r in _all_rules(session, exclude=name)}
    for g in groups:
        for r in g.rules:
            if r.name in existing:
                from broker.errors import SpecError

                raise SpecError("alert", f"{r.name!r} is already defined in another rules document")
    session.execute(sa.delete(_rules).where(_rules.c.name == name))
    session.execute(sa.insert(_rules).values(name=name, yaml_text=yaml_text, updated_at=now))
    return sum(len(g.rules) for g in groups)


def delete_rules(session: Any, name: str) -> bool:
    return bool(session.execute(sa.delete(_rules).where(_rules.c.name == name)).rowcount)


def _all_rules(session: Any, exclude: str | None = None) -> list[Rule]:
    out: list[Rule] = []
    for name, text in session.execute(sa.select(_rules.c.name, _rules.c.yaml_text).order_by(_rules.c.name)):
        if name == exclude:
            continue
        for g in parse_rules(text):
            out.extend(g.rules)
    return out


def list_alerts(session: Any, *, state: str | None = None, limit: int = 500) -> list[dict[str, Any]]:
    """Alerts as dictionaries, newest first (``state``: pending | firing | resolved)."""
    stmt = sa.select(_alerts).order_by(_alerts.c.id.desc()).limit(limit)
    if state:
        stmt = stmt.where(_alerts.c.state == state)
    out = []
    for r in session.execute(stmt):
        out.append({
            "id": r.id, "rule": r.rule, "severity": r.severity, "state": r.state, "labels": parse_labels(r.labels),
            "value": r.value, "summary": r.summary,
            "started_at": utc(r.started_at).isoformat(),
            "fired_at": utc(r.fired_at).isoformat() if r.fired_at else None,
            "resolved_at": utc(r.resolved_at).isoformat() if r.resolved_at else None,
            "group": r.group_key, "root_cause": r.root_cause, "delivered": r.delivered,
            "delivery_attempts": r.delivery_attempts, "delivery_error": r.delivery_error,
        })
    return out


@dataclass(frozen=True)
class Finding:
    """A rule's condition holding for one label set now."""

    rule: Rule
    labels: Mapping[str, str]
    value: float


@dataclass
class EvaluationReport:
    findings: int = 0
    pending: int = 0
    fired: int = 0
    resolved: int = 0
    retrained: int = 0
    groups: list[dict[str, Any]] = field(default_factory=list)


def _latest_fresh(s: Series, now_s: float, stale_seconds: float) -> bool:
    return len(s) > 0 and now_s - float(s.t_seconds[-1]) <= stale_seconds


class AlertEngine:
    """See the module docstring. ``webhook`` is a :class:`WebhookSender` or None (alerts only stored)."""

    def __init__(self, store: Any, clock: Any, *, metrics: Any = None, webhook: WebhookSender | None = None,
                 stale_seconds: float = 600.0, max_attempts: int = 8, retry_base_seconds: float = 10.0,
                 retry_max_seconds: float = 600.0) -> None:
        self.store = store
        self.clock = clock
        self.metrics = metrics
        self.webhook = webhook
        self.stale_seconds = stale_seconds
        self.max_attempts = max_attempts
        self.retry_base_seconds = retry_base_seconds
        self.retry_max_seconds = retry_max_seconds
        self._forests: dict[tuple[str, str], anomaly.ForestDetector] = {}

    # -- conditions -------------------------------------------------------------------------------

    def _static(self, session: Any, rule: Rule, c: StaticCondition, now: datetime) -> list[Finding]:
        since = now - timedelta(seconds=self.stale_seconds)
        out = []
        for s in read_series(session, c.selector.metric, selector=c.selector.match, since=since, until=now):
            if _latest_fresh(s, now.timestamp(), self.stale_seconds) and c.holds(float(s.values[-1])):
                out.append(Finding(rule, s.labels, float(s.values[-1])))
        return out

    def _baseline(self, session: Any, rule: Rule, b: Baseline, now: datetime) -> list[Finding]:
        span = b.period_seconds * (b.seasons + 1) if b.method == "seasonal" else max(86400.0, 0.0)
        since = now - timedelta(seconds=span)
        out = []
        for s in read_series(session, b.selector.metric, selector=b.selector.match, since=since, until=now):
            if not _latest_fresh(s, now.timestamp(), self.stale_seconds):
                continue
            if b.method == "seasonal":
                flags = anomaly.seasonal_flags(s.t_seconds, s.values, period_seconds=b.period_seconds,
                                               seasons=b.seasons, k=b.k, direction=b.direction,
                                               min_sigma=b.min_sigma)
            else:
                flags = anomaly.ewma_flags(s.values, alpha=b.alpha, k=b.k, warmup=b.warmup,
                                           direction=b.direction, min_sigma=b.min_sigma)
            if flags.size and flags[-1]:
                out.append(Finding(rule, s.labels, float(s.values[-1])))
        return out

    def _anomaly(self, session: Any, rule: Rule, a: Anomaly, now: datetime, report: EvaluationReport
                 ) -> list[Finding]:
        since = now - timedelta(seconds=a.window_seconds)
        per_group: dict[str, list[Series | None]] = defaultdict(lambda: [None] * len(a.selectors))
        common: dict[str, dict[str, str]] = {}
        for i, sel in enumerate(a.selectors):
            for s in read_series(session, sel.metric, selector=sel.match, since=since, until=now):
                key = s.labels.get(a.by)
                if key is None:
                    continue
                per_group[key][i] = s
                shared = {k: v for k, v in s.labels.items() if k not in sel.match and k != "resource"}
                common[key] = {k: v for k, v in common.get(key, shared).items() if shared.get(k) == v}
        out = []
        now_s = now.timestamp()
        for key, cols in per_group.items():
            if any(c is None or not _latest_fresh(c, now_s, self.stale_seconds) for c in cols):
                continue
            series = [c for c in cols if c is not None]
            step = float(np.median(np.diff(series[0].t_seconds))) if len(series[0]) > 1 else 60.0
            t, X = anomaly.align([(c.t_seconds, c.values) for c in series], max(step, 1.0))
            if len(t) < a.min_samples:
                continue
            det = self._forests.setdefault((rule.name, key), anomaly.ForestDetector(
                contamination=a.contamination, retrain_seconds=a.retrain_seconds))
            if det.due(now_s):
                det.fit(X[:-1], now_s)
                report.retrained += 1
            if bool(det.flags(X[-1:])[0]):
                out.append(Finding(rule, {**common.get(key, {}), a.by: key}, float(X[-1, 0])))
        return out

    # -- evaluation -------------------------------------------------------------------------------

    def evaluate(self, now: datetime | None = None) -> EvaluationReport:
        """Evaluate every stored rule at ``now`` and move alert states (see the module docstring)."""
        now = now or self.clock.now()
        report = EvaluationReport()
        with self.store.read() as session:
            try:
                rules = _all_rules(session)
            except Exception:  # noqa: BLE001 - stored rules were validated; a bad row must not stop alerts
                rules = []
            findings: list[Finding] = []
            for rule in rules:
                c = rule.condition
                if isinstance(c, StaticCondition):
                    findings += self._static(session, rule, c, now)
                elif isinstance(c, Baseline):
                    findings += self._baseline(session, rule, c, now)
                else:
                    findings += self._anomaly(session, rule, c, now, report)
            topo_labels = [s.labels for name in ("utilization", "edge_link_latency_seconds")
                           for s in read_series(session, name, since=now - timedelta(seconds=self.stale_seconds),
                                                until=now)]
        report.findings = len(findings)
        active = {fingerprint(f.rule.name, {**f.labels, **f.rule.labels}): f for f in findings}
        with self.store.tx() as session:
            open_rows = {r.fingerprint: r for r in session.execute(
                sa.select(_alerts).where(_alerts.c.state.in_(("pending", "firing"))))}
            for fp, f in active.items():
                labels = {**f.labels, **f.rule.labels}
                summary = f.rule.annotations.get("summary", f"{f.rule.name} on {label_key(labels)}")
                row = open_rows.get(fp)
                firing_now = f.rule.for_seconds <= 0
                if row is None:
                    session.execute(sa.insert(_alerts).values(
                        fingerprint=fp, rule=f.rule.name, severity=f.rule.severity,
                        state="firing" if firing_now else "pending", labels=label_key(labels), value=f.value,
                        summary=summary, started_at=now, fired_at=now if firing_now else None,
                        group_key="", root_cause="", delivered=not firing_now, delivery_attempts=0,
                        next_delivery_at=now if firing_now else None, delivery_error=""))
                    report.fired += firing_now
                    report.pending += not firing_now
                elif row.state == "pending" and (now - utc(row.started_at)).total_seconds() >= f.rule.for_seconds:
                    session.execute(sa.update(_alerts).where(_alerts.c.id == row.id).values(
                        state="firing", fired_at=now, value=f.value, delivered=False, next_delivery_at=now))
                    report.fired += 1
                else:
                    session.execute(sa.update(_alerts).where(_alerts.c.id == row.id).values(value=f.value))
            for fp, row in open_rows.items():
                if fp in active:
                    continue
                if row.state == "pending":
                    session.execute(sa.delete(_alerts).where(_alerts.c.id == row.id))
                else:
                    session.execute(sa.update(_alerts).where(_alerts.c.id == row.id).values(
                        state="resolved", resolved_at=now, delivered=False, next_delivery_at=now,
                        delivery_attempts=0))
                    report.resolved += 1
            firing = list(session.execute(sa.select(_alerts.c.id, _alerts.c.labels).where(_alerts.c.state == "firing")
                                          .order_by(_alerts.c.id)))
            groups = group_alerts([parse_labels(r.labels) for r in firing], Topology(topo_labels))
            for g in groups:
                ids = [firing[i].id for i in g.members]
                session.execute(sa.update(_alerts).where(_alerts.c.id.in_(ids)).values(
                    group_key=g.key, root_cause=f"{g.key}: {g.explanation}"))
                report.groups.append({"root_cause": g.key, "explanation": g.explanation, "alerts": ids})
        if self.metrics is not None:
            self._export()
        return report

    def _export(self) -> None:
        with self.store.read() as session:
            rows = session.execute(sa.select(_alerts.c.rule, _alerts.c.severity, sa.func.count())
                                   .where(_alerts.c.state == "firing").group_by(_alerts.c.rule, _alerts.c.severity))
            self.metrics.alerts_firing.clear()
            for rule, severity, n in rows:
                self.metrics.alerts_firing.labels(rule, severity).set(n)

    # -- delivery ---------------------------------------------------------------------------------

    def deliver(self, now: datetime | None = None) -> dict[str, int]:
        """Send the queued alerts whose delivery is due, one signed POST per group; returns counts."""
        now = now or self.clock.now()
        counts = {"sent": 0, "failed": 0, "gave_up": 0}
        if self.webhook is None:
            return counts
        with self.store.read() as session:
            due = list(session.execute(sa.select(_alerts).where(
                _alerts.c.delivered.is_(False), _alerts.c.next_delivery_at.is_not(None),
                _alerts.c.next_delivery_at <= now).order_by(_alerts.c.id)))
        by_group: dict[str, list[Any]] = defaultdict(list)
        for r in due:
            by_group[r.group_key or label_key(parse_labels(r.labels))].append(r)
        for group, rows in by_group.items():
            payload = {
                "version": 1, "group": group, "root_cause": rows[0].root_cause,
                "alerts": [{"rule": r.rule, "severity": r.severity, "state": r.state, "labels": parse_labels(r.labels),
                            "value": r.value, "summary": r.summary, "started_at": utc(r.started_at).isoformat()}
                           for r in rows],
            }
            result = self.webhook.send(payload, now.timestamp())
            ids = [r.id for r in rows]
            attempts = max(r.delivery_attempts for r in rows) + 1
            with self.store.tx() as session:
                if result.ok:
                    session.execute(sa.update(_alerts).where(_alerts.c.id.in_(ids)).values(
                        delivered=True, delivery_attempts=attempts, next_delivery_at=None, delivery_error=""))
                    counts["sent"] += 1
                elif attempts >= self.max_attempts:
                    session.execute(sa.update(_alerts).where(_alerts.c.id.in_(ids)).values(
                        delivery_attempts=attempts, next_delivery_at=None,
                        delivery_error=f"gave up after {attempts} attempts: {result.error}"))
                    counts["gave_up"] += 1
                else:
                    delay = retry_delay_seconds(attempts, self.retry_base_seconds, self.retry_max_seconds)
                    session.execute(sa.update(_alerts).where(_alerts.c.id.in_(ids)).values(
                        delivery_attempts=attempts, next_delivery_at=now + timedelta(seconds=delay),
                        delivery_error=result.error))
                    counts["failed"] += 1
            if self.metrics is not None:
                self.metrics.webhook_deliveries.labels("sent" if result.ok else "failed").inc()
        return counts


def summary_json(report: EvaluationReport) -> str:
    return json.dumps(report.__dict__)
