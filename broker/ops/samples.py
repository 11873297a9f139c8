"""Metric history in the store: write samples, read series back.

A series is a metric ``name`` and a label set; labels are stored canonically (:func:`label_key`) so a
series is one index range. Reads return :class:`Series` (numpy arrays of epoch seconds and values).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

import numpy as np
import sqlalchemy as sa

from broker.ops.store import MetricSampleRow
from broker.store import utc

__all__ = ["Sample", "Series", "label_key", "parse_labels", "record", "read_series", "series_names", "prune"]

_samples = MetricSampleRow.__table__  # type: ignore[attr-defined]


def label_key(labels: Mapping[str, str]) -> str:
    """The canonical form of a label set: ``k=v`` pairs sorted by key, joined by commas."""
    for k, v in labels.items():
        if any(c in str(k) + str(v) for c in ",="):
            raise ValueError(f"label {k}={v}: ',' and '=' are not allowed in label names or values")
    return ",".join(f"{k}={labels[k]}" for k in sorted(labels))


def parse_labels(key: str) -> dict[str, str]:
    """The label set of a canonical key (inverse of :func:`label_key`)."""
    return dict(p.split("=", 1) for p in key.split(",") if p)


@dataclass(frozen=True)
class Sample:
    name: str
    labels: Mapping[str, str]
    value: float
    at: datetime


@dataclass(frozen=True)
class Series:
    """One series over time: ``t_seconds`` (epoch seconds, ascending) and ``values``."""

    name: str
    labels: Mapping[str, str]
    t_seconds: np.ndarray = field(repr=False)
    values: np.ndarray = field(repr=False)

    def __len__(self) -> int:
        return int(self.values.size)


def record(session: sa.orm.Session, samples: Iterable[Sample]) -> int:
    """Insert ``samples`` in the caller's transaction; returns how many."""
    rows = [{"at": utc(s.at), "name": s.name, "labels": label_key(s.labels), "value": float(s.value)}
            for s in samples]
    if rows:
        session.execute(sa.insert(_samples), rows)
    return len(rows)


def _matches(labels: Mapping[str, str], selector: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def read_series(session: sa.orm.Session, name: str, *, selector: Mapping[str, str] | None = None,
                since: datetime | None = None, until: datetime | None = None) -> list[Series]:
    """Every series of ``name`` whose labels include ``selector``, between ``since`` and ``until``."""
    stmt = sa.select(_samples.c.labels, _samples.c.at, _samples.c.value).where(_samples.c.name == name)
    if since is not None:
        stmt = stmt.where(_samples.c.at >= utc(since))
    if until is not None:
        stmt = stmt.where(_samples.c.at <= utc(until))
    stmt = stmt.order_by(_samples.c.labels, _samples.c.at)
    grouped: dict[str, tuple[list[float], list[float]]] = {}
    for key, at, value in session.execute(stmt):
        ts, vs = grouped.setdefault(key, ([], []))
        ts.append(utc(at).timestamp())
        vs.append(value)
    out = []
    for key, (ts, vs) in grouped.items():
        labels = parse_labels(key)
        if selector and not _matches(labels, selector):
            continue
        out.append(Series(name, labels, np.asarray(ts, dtype=float), np.asarray(vs, dtype=float)))
    return out


def series_names(session: sa.orm.Session) -> list[str]:
    """The metric names with at least one stored sample."""
    return list(session.execute(sa.select(_samples.c.name).distinct().order_by(_samples.c.name)).scalars())


def prune(session: sa.orm.Session, before: datetime) -> int:
    """Delete samples older than ``before`` (retention); returns how many."""
    result = session.execute(sa.delete(_samples).where(_samples.c.at < utc(before)))
    return int(getattr(result, "rowcount", 0) or 0)

