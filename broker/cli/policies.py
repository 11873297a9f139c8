"""`broker apply` and `broker policies ...`: scheduling policy documents through the API.

* ``broker apply -f quota.yaml [-f more.yaml]`` applies ResourceQuota, PriorityClass, Budget and
  Reservation documents (several per file, ``---``-separated) with ``POST /v1/policies:apply``; the files
  are checked locally first, so a mistake names the file and the field.
* ``broker policies priorityclasses``, ``broker policies quotas [NS]``, ``broker policies budget NS``
  show what is in force, quota usage, and budget burn with the projected month-end spend.
* ``broker policies allow NS [CLASS ...] [--none | --reset]`` sets (admin) which PriorityClasses the tokens of
  ``NS`` may name; without classes or flags it shows them (``AllowedPriorityClasses`` documents do the same
  through ``broker apply``).

Talks to ``BROKER_URL`` with ``BROKER_TOKEN`` (see :mod:`broker.client`). Errors: one line on stderr,
exit 2 for an invalid document, 1 otherwise.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from broker.errors import SpecError

__all__ = ["register", "read_policy_files"]

_KINDS = ("ResourceQuota", "PriorityClass", "Budget", "Reservation", "AllowedPriorityClasses")


def read_policy_files(paths: list[Path]) -> list[dict[str, Any]]:
    """Every document of ``paths``, validated locally. Raises :class:`SpecError` naming file and field."""
    from broker.spec import load_documents
    from policies.budget import parse_budget
    from policies.priority import parse_allowed_classes, parse_priority_class
    from policies.quota import parse_resource_quota

    checks: dict[str, Callable[[dict[str, Any]], object]] = {
        "ResourceQuota": parse_resource_quota,
        "PriorityClass": parse_priority_class,
        "Budget": parse_budget,
        "AllowedPriorityClasses": parse_allowed_classes,
    }
    docs: list[dict[str, Any]] = []
    for path in paths:
        if not path.is_file():
            raise SpecError(str(path), "no such file. To fix: pass -f with the path of a YAML file")
        try:
            found = load_documents(path.read_bytes())
        except SpecError as exc:
            raise SpecError(f"{path}:{exc.field}" if exc.field else str(path), exc.message) from None
        for i, doc in enumerate(found):
            where = f"{path}[{i}]"
            if not isinstance(doc, dict):
                raise SpecError(where, "expected a document (mapping)")
            kind = doc.get("kind")
            if kind not in _KINDS:
                raise SpecError(f"{where}.kind", f"{kind!r} is not a policy document; use one of {', '.join(_KINDS)}")
            check = checks.get(str(kind))
            if check is not None:
                try:
                    check(doc)
                except SpecError as exc:
                    raise SpecError(f"{where}.{exc.field}", exc.message) from None
            docs.append(doc)
    if not docs:
        raise SpecError(", ".join(map(str, paths)), "no documents found")
    return docs


def _client() -> Any:
    from broker.client import BrokerClient

    return BrokerClient()


def _print(data: Any, as_json: bool, lines: list[str]) -> None:
    if as_json:
        typer.echo(json.dumps(data, indent=2, sort_keys=True))
    else:
        for line in lines:
            typer.echo(line)


def register(app: typer.Typer) -> None:
    """Add ``apply`` and the ``policies`` group to the root app."""

    @app.command("apply")
    def apply(
        files: Annotated[list[Path], typer.Option("-f", "--filename", help="YAML/JSON file of policy documents")],
        as_json: Annotated[bool, typer.Option("--json", help="print the API's JSON answer")] = False,
    ) -> None:
        """Apply ResourceQuota, PriorityClass, Budget and Reservation documents (like kubectl apply)."""
        docs = read_policy_files(files)
        with _client() as client:
            answer = client.apply_policies(docs)
        _print(answer, as_json, [
            f"{a['kind'].lower()}/{a['name']}{' (' + a['namespace'] + ')' if a.get('namespace') else ''} {a['action']}"
            for a in answer.get("applied", [])
        ])

    group = typer.Typer(help="Show scheduling policies: priority classes, quotas, budgets.", no_args_is_help=True)
    app.add_typer(group, name="policies")

    @group.command("priorityclasses")
    def priorityclasses(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
        """List priority classes, highest first."""
        with _client() as client:
            data = client._json("GET", "/v1/priorityclasses")
        _print(data, as_json, [
            f"{c['name']:<24} {c['value']:>12} {c['preemptionPolicy']:<22}{' (default)' if c['globalDefault'] else ''}"
            for c in data["items"]
        ])

    @group.command("quotas")
    def quotas(
        namespace: Annotated[str | None, typer.Argument(help="a namespace (admin: all when omitted)")] = None,
        as_json: Annotated[bool, typer.Option("--json")] = False,
    ) -> None:
        """Quotas with used/hard per resource."""
        path = f"/v1/namespaces/{namespace}/quotas" if namespace else "/v1/quotas"
        with _client() as client:
            data = client._json("GET", path)
        lines = []
        for q in data["items"]:
            lines.append(f"{q['namespace']}/{q['name']}{' cohort ' + q['cohort'] if q.get('cohort') else ''}")
            for key, s in sorted(q["status"].items()):
                lines.append(f"  {key:<26} {s['used']:>10g} / {s['hard']:g}")
        _print(data, as_json, lines or ["no quotas"])

    @group.command("budget")
    def budget(
        namespace: Annotated[str, typer.Argument(help="the namespace")],
        as_json: Annotated[bool, typer.Option("--json")] = False,
    ) -> None:
        """Budget limits, spend today and this month, and the projected month-end spend; dry-run jobs'
        simulated spend on a line of its own (it counts against no budget)."""
        with _client() as client:
            data = client._json("GET", f"/v1/namespaces/{namespace}/budget")
        b = data["burn"]
        lines = [f"{x['name']}: daily ${x['dailyUSD']} monthly ${x['monthlyUSD']} ({x['enforcement']})"
                 for x in data["budgets"]] or ["no budget"]
        lines += [f"today ${b['today_usd']:.2f}  month ${b['month_usd']:.2f}  "
                  f"rate ${b['daily_rate_usd']:.2f}/day  projected ${b['projected_month_usd']:.2f}",
                  f"dry-run (simulated, not in the budget): today ${b.get('dry_run_today_usd', 0.0):.2f}  "
                  f"month ${b.get('dry_run_month_usd', 0.0):.2f}"]
        _print(data, as_json, lines)

    @group.command("allow")
    def allow(
        namespace: Annotated[str, typer.Argument(help="the namespace")],
        classes: Annotated[list[str] | None, typer.Argument(help="PriorityClass names its tokens may use")] = None,
        none: Annotated[bool, typer.Option("--none", help="allow no class beyond the global default")] = False,
        reset: Annotated[bool, typer.Option("--reset", help="remove the list: classes at or below the default")]
        = False,
        as_json: Annotated[bool, typer.Option("--json")] = False,
    ) -> None:
        """Set (admin) or show which PriorityClasses the tokens of a namespace may name."""
        if sum((bool(classes), none, reset)) > 1:
            raise SpecError("allow", "give classes, --none or --reset, not several")
        path = f"/v1/namespaces/{namespace}/priorityclasses"
        with _client() as client:
            if reset:
                data = client._json("DELETE", path)
            elif classes or none:
                data = client._json("PUT", path, json={"priorityClassNames": list(classes or [])})
            else:
                data = client._json("GET", path)
        rule = ("allow-list: " + (", ".join(data["allowList"]) or "none") if data["allowList"] is not None
                else f"no allow-list: classes at or below the default priority ({data['defaultValue']})")
        _print(data, as_json, [f"{namespace}: {rule}"] + [
            f"  {c['name']:<24} {c['value']:>12} {c['preemptionPolicy']}" for c in data["usable"]])
