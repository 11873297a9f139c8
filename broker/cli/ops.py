"""``broker alerts ...``, ``broker history ...``, ``broker pools list``, ``broker recommendations`` and
``broker replay``: fleet operations from the command line, over the API (``BROKER_URL`` with ``BROKER_TOKEN``,
see :mod:`broker.client`); ``broker replay`` works locally.

Errors print one line on stderr and exit non-zero (2: invalid input, 1: anything else).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from broker.errors import SpecError

__all__ = ["register", "alerts_app", "history", "pools_app", "recommendations", "replay_app"]

alerts_app = typer.Typer(name="alerts", help="Alerts and alert rules.", no_args_is_help=True)
pools_app = typer.Typer(name="pools", help="Broker-owned elastic pools.", no_args_is_help=True)


def _client() -> Any:
    from broker.client import BrokerClient

    return BrokerClient()


@alerts_app.command("list")
def alerts_list(
    state: Annotated[str | None, typer.Option(help="pending | firing | resolved")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="the API's answer as JSON")] = False,
) -> None:
    """List alerts, newest first, with their group and root cause."""
    if state is not None and state not in ("pending", "firing", "resolved"):
        raise SpecError("--state", f"{state!r}: use pending, firing or resolved")
    params = {"state": state} if state else {}
    with _client() as c:
        items = c._json("GET", "/v1/ops/alerts", params=params)["items"]
    if as_json:
        print(json.dumps(items, indent=2))
        return
    if not items:
        print("no alerts")
        return
    from rich.console import Console
    from rich.table import Table

    table = Table("id", "state", "severity", "rule", "labels", "value", "since", "root cause")
    for a in items:
        labels = ",".join(f"{k}={v}" for k, v in sorted(a["labels"].items()))
        table.add_row(str(a["id"]), a["state"], a["severity"], a["rule"], labels, f"{a['value']:.4g}",
                      a["fired_at"] or a["started_at"], a["root_cause"] or "-")
    Console(width=200).print(table)


@alerts_app.command("apply")
def alerts_apply(
    file: Annotated[Path, typer.Argument(help="a rules YAML file (groups: [{name, rules: [...]}])")],
    name: Annotated[str | None, typer.Option(help="document name (default: the file's stem)")] = None,
) -> None:
    """Validate a rules file and store it in the broker (replacing a document of the same name)."""
    from broker.ops.rules import parse_rules

    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(str(file), f"cannot read: {exc}") from None
    parse_rules(text)  # a mistake is reported here, before anything is sent
    with _client() as c:
        out = c._json("PUT", f"/v1/ops/alert-rules/{name or file.stem}", content=text.encode(),
                      headers={"Content-Type": "application/yaml"})
    print(f"stored {out['rules']} rule(s) as {out['name']}")


@alerts_app.command("evaluate")
def alerts_evaluate() -> None:
    """Evaluate the rules now (admin) and deliver what is due."""
    with _client() as c:
        out = c._json("POST", "/v1/ops/alerts/evaluate", retry=False)
    print(f"{out['findings']} finding(s): {out['fired']} fired, {out['resolved']} resolved, "
          f"{len(out['groups'])} group(s)")


def history(
    metric: Annotated[str, typer.Argument(help="a metric name, e.g. utilization, queue_length, spend_usd_per_hour")],
    since: Annotated[str, typer.Option(help="7d, 24h, 90m or an ISO date")] = "24h",
    until: Annotated[str | None, typer.Option(help="same forms as since; default now")] = None,
    match: Annotated[list[str] | None, typer.Option(help="label=value (repeatable)")] = None,
    plot: Annotated[Path | None, typer.Option(help="write a PNG plot of the series here")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Trends of one metric from the stored history: per series first/min/mean/max/last, and a plot."""
    for m in match or []:
        if "=" not in m:
            raise SpecError("--match", f"{m!r} is not label=value")
    params: list[tuple[str, str]] = [("since", since)] + [("match", m) for m in match or []]
    if until:
        params.append(("until", until))
    with _client() as c:
        out = c._json("GET", f"/v1/ops/metrics/{metric}", params=params)
    from broker.ops.history import plot_series, trend_rows

    rows = trend_rows(out["series"])
    if as_json:
        print(json.dumps(rows, indent=2))
    else:
        from rich.console import Console
        from rich.table import Table

        table = Table("series", "points", "first", "min", "mean", "max", "last", "trend/h")
        for r in rows:
            table.add_row(r["series"], str(r["points"]), *(f"{r[k]:.4g}" for k in
                                                           ("first", "min", "mean", "max", "last", "slope_per_hour")))
        Console(width=200).print(table)
        if not rows:
            print(f"no samples of {metric} in that window")
    if plot is not None:
        plot_series(metric, out["series"], plot)
        print(f"plot written to {plot}", file=sys.stderr)


@pools_app.command("list")
def pools_list(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Broker-owned pools: replicas, bounds, last scaling decision."""
    with _client() as c:
        items = c._json("GET", "/v1/ops/pools")["items"]
    if as_json:
        print(json.dumps(items, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table("pool", "provider", "type", "min", "desired", "max", "current", "last decision")
    for p in items:
        table.add_row(p["name"], p["provider"], p["instance_type"], str(p["min_replicas"]), str(p["desired"]),
                      str(p["max_replicas"]), str(len(p["instances"])), p.get("last_decision", "") or "-")
    Console(width=200).print(table)


def recommendations(
    days: Annotated[float, typer.Option(help="look back this many days")] = 7.0,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Over-requested resources (VPA, from measured usage), idle pools and spot candidates."""
    if days <= 0:
        raise SpecError("--days", "must be > 0")
    with _client() as c:
        items = c._json("GET", "/v1/ops/recommendations", params={"days": days})["items"]
    if as_json:
        print(json.dumps(items, indent=2))
        return
    for r in items:
        print(f"[{r['kind']}] {r['namespace']}: {r['message']}")
    if not items:
        print("no recommendations")


replay_app = typer.Typer(name="replay", help="Capacity planning: record and replay submissions.",
                         no_args_is_help=True)


@replay_app.command("record")
def replay_record(
    out: Annotated[Path, typer.Argument(help="the trace file to write (JSON lines)")],
    database_url: Annotated[str, typer.Option(envvar="BROKER_DATABASE_URL", help="the broker's store")],
    since: Annotated[str | None, typer.Option(help="7d, 24h or an ISO date")] = None,
) -> None:
    """Write the submissions recorded in a store as a trace."""
    from datetime import UTC, datetime

    from broker.ops.replay import record_trace, write_trace
    from broker.reports.store import parse_when
    from broker.store import Store

    since_at = parse_when(since, now=datetime.now(UTC), field="--since") if since else None
    store = Store(database_url)
    try:
        n = write_trace(out, record_trace(store, since=since_at))
    finally:
        store.dispose()
    print(f"{n} submission(s) written to {out}")


@replay_app.command("run")
def replay_run(
    trace: Annotated[Path, typer.Argument(help="a trace file (broker replay record)")],
    inventory: Annotated[Path | None, typer.Option(help="the fleet to replay against (inventory YAML)")] = None,
    policies: Annotated[Path | None, typer.Option(help="policy documents (ResourceQuota, Budget, ...) YAML")] = None,
    providers: Annotated[str, typer.Option(help="comma-separated providers")] = "onprem,aws,azure,gcp",
    tick: Annotated[float, typer.Option(help="simulated seconds between scheduler cycles")] = 300.0,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Re-run a trace through the real scheduler in simulated time; report waits, deadline misses, spend."""

    from broker.ops.replay import read_trace, replay

    if not trace.is_file():
        raise SpecError(str(trace), "no such file")
    if tick <= 0:
        raise SpecError("--tick", "must be > 0")
    docs: list[Any] = []
    if policies is not None:
        from broker.spec import load_documents

        try:
            docs = load_documents(policies.read_bytes())
        except OSError as exc:
            raise SpecError(str(policies), f"cannot read policy documents: {exc.strerror}") from None
        except SpecError as exc:
            raise SpecError(str(policies), str(exc)) from None
    names = tuple(p.strip() for p in providers.split(",") if p.strip())
    if "onprem" in names and inventory is None:
        names = tuple(p for p in names if p != "onprem")
    result = replay(read_trace(trace), inventory=inventory, policies=docs, providers=names, tick_seconds=tick)
    summary = result.summary()
    if as_json:
        print(json.dumps(summary, indent=2))
        return
    print(f"{result.jobs} jobs: {result.succeeded} succeeded, {result.failed} failed, {result.unfinished} unfinished; "
          f"{result.deadline_misses} deadline misses")
    by = ", ".join(f"{k} ${v:.2f}" for k, v in sorted(result.spend_by_provider.items()))
    print(f"wait: mean {result.mean_wait_seconds:.0f} s, p95 {result.p95_wait_seconds:.0f} s; "
          f"spend ${result.spend_usd:.2f} ({by})")
    print(f"simulated {result.simulated_hours:.1f} h in {result.wall_seconds:.1f} s ({result.cycles} cycles)")


def register(app: typer.Typer) -> None:
    """Add this module's commands to the root app."""
    app.add_typer(alerts_app)
    app.add_typer(pools_app)
    app.add_typer(replay_app)
    app.command("history")(history)
    app.command("recommendations")(recommendations)
