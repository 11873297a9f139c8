"""Spot interruption risk: the expected extra cost of a spot run that may be reclaimed part-way.

Rate (interruptions per instance-hour) of a spot location ``provider:region``, first match wins:

1. **history**: observed ``interruptions`` over ``spot_hours`` instance-hours there (``rate = interruptions /
   spot_hours``), from the file ``$BROKER_SPOT_HISTORY`` (YAML, shape of :func:`load_interruptions`);
2. a **band** named for that location in the same file;
3. the **default band**: ``5-10%`` for every cloud.

A band is a published monthly interruption frequency (AWS Spot Instance Advisor "Frequency of interruption":
``<5%``, ``5-10%``, ``10-15%``, ``15-20%``, ``>20%``; Azure's eviction-rate bands have the same steps; GCP
publishes none, so its spot capacity gets the default band). A band's monthly share ``m`` (its midpoint; 22.5%
for ``>20%``) becomes an hourly rate ``-ln(1 - m) / 730``.

Expected cost (for a job of ``N`` nodes that pays ``T`` hours each, transfer included): a gang stops when any node
is reclaimed, so interruptions come at ``N x rate`` per hour, ``N x rate x T`` expected over the run; each one
loses on average half the run (no checkpoint is known to placement) plus ``restart_hours`` (0.1 h) to get new
capacity, paid on all ``N`` nodes::

    interruption_usd = compute_usd x N x rate x (T / 2 + restart_hours)

The rate is per location, so within a location a cheaper spot row always has the lower expected cost (the
placement engine's ranking relies on that).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from broker.errors import SpecError
from broker.model import Location

__all__ = ["InterruptionModel", "load_interruptions", "BANDS", "DEFAULT_BAND", "HOURS_PER_MONTH", "band_rate"]

HOURS_PER_MONTH = 730.0
# Published bands (monthly share of spot capacity reclaimed) -> the share used (the band's midpoint).
BANDS: Mapping[str, float] = {"<5%": 0.025, "5-10%": 0.075, "10-15%": 0.125, "15-20%": 0.175, ">20%": 0.225}
DEFAULT_BAND = "5-10%"
RESTART_HOURS = 0.1


def band_rate(band: str) -> float:
    """Interruptions per instance-hour of a published monthly band. Raises :class:`SpecError` for another."""
    share = BANDS.get(band.replace(" ", ""))
    if share is None:
        raise SpecError("band", f"{band!r} is not an interruption band. To fix: use one of {', '.join(BANDS)}")
    return -math.log(1.0 - share) / HOURS_PER_MONTH


@dataclass(frozen=True)
class InterruptionModel:
    """Hourly interruption rates of spot capacity per location (see module docstring)."""

    default_rate: float = field(default_factory=lambda: band_rate(DEFAULT_BAND))
    restart_hours: float = RESTART_HOURS
    rates: Mapping[str, float] = field(default_factory=dict)  # provider:region -> interruptions per hour
    sources: Mapping[str, str] = field(default_factory=dict)  # provider:region -> "history ..." / "band ..."
    _cache: dict[Any, np.ndarray] = field(default_factory=dict, repr=False, compare=False, hash=False)

    def rate(self, location: str) -> float:
        """Interruptions per instance-hour of spot capacity at ``location`` (``provider:region``)."""
        return self.rates.get(location, self.default_rate)

    def source(self, location: str) -> str:
        """Where the rate of ``location`` comes from (for explanations)."""
        return self.sources.get(location, f"default band {DEFAULT_BAND} per month")

    def location_rates(self, locations: Sequence[Location]) -> np.ndarray:
        """The rate of every location of a catalog's location table (cached per table)."""
        key = (id(locations), len(locations))
        hit = self._cache.get(key)
        if hit is None:
            hit = np.array([self.rate(loc.key) for loc in locations], dtype=np.float64)
            if len(self._cache) > 64:
                self._cache.clear()
            self._cache[key] = hit
        return hit

    def factor(self, nodes: int, paid_hours: np.ndarray, rate: np.ndarray) -> np.ndarray:
        """``interruption_usd / compute_usd`` for ``nodes`` nodes paying ``paid_hours`` each at ``rate``."""
        return nodes * rate * (paid_hours / 2.0 + self.restart_hours)


def load_interruptions(path: str | Path | None = None) -> InterruptionModel:
    """The interruption model, with ``path`` (``None`` -> ``$BROKER_SPOT_HISTORY``, unset -> defaults only)::

        default_band: 5-10%          # optional
        restart_hours: 0.1           # optional
        locations:
          aws:us-east-1: {spot_hours: 1200, interruptions: 3}   # history: 3 / 1200 per hour
          azure:eastus: {band: ">20%"}

    Raises :class:`SpecError` naming the file and field for unreadable or invalid content."""
    if path is None:
        env = os.environ.get("BROKER_SPOT_HISTORY") or None
        if env is None:
            return _default()
        try:  # placement asks for the model per call: parse the file once per change
            return _from_file(env, Path(env).stat().st_mtime_ns)
        except OSError:
            path = env
    return _parse(Path(path))


@lru_cache(maxsize=4)
def _from_file(path: str, _mtime_ns: int) -> InterruptionModel:
    return _parse(Path(path))


def _parse(p: Path) -> InterruptionModel:
    try:
        doc = yaml.safe_load(p.read_text()) or {}
    except OSError as exc:
        raise SpecError(str(p), f"cannot read the spot history: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise SpecError(str(p), f"invalid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(doc, Mapping):
        raise SpecError(str(p), "the spot history must be a mapping")
    default = band_rate(str(doc.get("default_band", DEFAULT_BAND)))
    restart = float(doc.get("restart_hours", RESTART_HOURS))
    rates: dict[str, float] = {}
    sources: dict[str, str] = {}
    for key, v in (doc.get("locations") or {}).items():
        f = f"{p}: locations.{key}"
        if not isinstance(v, Mapping):
            raise SpecError(f, "must be {spot_hours, interruptions} or {band}")
        if "spot_hours" in v or "interruptions" in v:
            hours, n = float(v.get("spot_hours", 0)), float(v.get("interruptions", -1))
            if hours <= 0 or n < 0:
                raise SpecError(f, "history needs spot_hours > 0 and interruptions >= 0")
            rates[key] = n / hours
            sources[key] = f"history: {n:g} interruptions in {hours:g} spot instance-hours"
        elif "band" in v:
            rates[key] = band_rate(str(v["band"]))
            sources[key] = f"band {v['band']} per month"
        else:
            raise SpecError(f, "must be {spot_hours, interruptions} or {band}")
    return InterruptionModel(default, restart, rates, sources)


@lru_cache(maxsize=1)
def _default() -> InterruptionModel:
    return InterruptionModel()
