"""`broker report placements`: write the placement report (HTML, CSV or JSON) to a file.

Where the records come from, first match wins:

1. ``--database-url`` or ``BROKER_DATABASE_URL``: read that store directly;
2. ``--data-dir``: read ``<data dir>/broker.db`` directly;
3. ``BROKER_URL`` or ``BROKER_TOKEN``: ask the running broker (``GET /v1/reports/placements`` with
   ``BROKER_TOKEN``) at ``BROKER_URL``, by default ``http://127.0.0.1:8080`` like every client command;
4. otherwise the default data dir (``BROKER_DATA_DIR`` or ``~/.hybrid-broker``).
"""

from __future__ import annotations

import os
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer

from broker.errors import BrokerError, SpecError

__all__ = ["register", "report_app"]

report_app = typer.Typer(name="report", help="Reports over the broker's decisions.", no_args_is_help=True)


def _fail(message: str, code: int) -> typer.Exit:
    print(f"error: {message}", file=sys.stderr)
    return typer.Exit(code)


def _via_api(url: str, fmt: str, namespace: str | None, since: str, until: str | None) -> bytes:
    import httpx

    params = {"format": fmt, "since": since}
    if namespace:
        params["namespace"] = namespace
    if until:
        params["until"] = until
    headers = {}
    token = os.environ.get("BROKER_TOKEN")
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        resp = httpx.get(f"{url.rstrip('/')}/v1/reports/placements", params=params, headers=headers, timeout=120)
    except httpx.HTTPError as exc:
        raise BrokerError(f"cannot reach the broker at {url} ({exc}). To fix: check BROKER_URL") from None
    if resp.status_code >= 400:
        try:
            detail = resp.json().get("detail", resp.text)
        except ValueError:
            detail = resp.text
        if resp.status_code == 422:
            raise SpecError("query", str(detail))
        raise BrokerError(f"the broker answered {resp.status_code}: {detail}")
    return resp.content


@report_app.command("placements")
def placements(
    out: Annotated[Path, typer.Option("--out", "-o", help="file to write (parent dirs are created)")],
    fmt: Annotated[str, typer.Option("--format", "-f", help="html, csv or json")] = "html",
    namespace: Annotated[str | None, typer.Option("--namespace", "-n", help="one namespace (default all)")] = None,
    since: Annotated[str, typer.Option(help="start: 7d, 24h, 90m, 2w, or an ISO date/datetime")] = "7d",
    until: Annotated[str | None, typer.Option(help="end (exclusive), same forms as --since; default now")] = None,
    data_dir: Annotated[
        Path | None, typer.Option("--data-dir", help="broker data dir: its store and recorded catalogs")
    ] = None,
    database_url: Annotated[str | None, typer.Option("--database-url", help="read this store directly")] = None,
) -> None:
    """Write the placement report: spend, savings against baselines, each decision and why,
    deadlines and what-if scenarios. Prints the path written."""
    from broker.reports import FORMATS, parse_when, write_report

    if fmt not in FORMATS:
        raise _fail(f"--format: {fmt!r} is not a report format. To fix: use one of {', '.join(FORMATS)}", 2)
    now = datetime.now(UTC)
    try:
        since_at = parse_when(since, now=now, field="--since")
        until_at = parse_when(until, now=now, field="--until")
    except SpecError as exc:
        raise _fail(str(exc), 2) from None
    if since_at is not None and until_at is not None and until_at <= since_at:
        raise _fail("--until: must be after --since. To fix: widen the window", 2)
    db_url = database_url or os.environ.get("BROKER_DATABASE_URL")
    api_url = os.environ.get("BROKER_URL")
    if not api_url and os.environ.get("BROKER_TOKEN"):
        from broker.client import DEFAULT_URL

        api_url = DEFAULT_URL
    try:
        if db_url is None and data_dir is None and api_url:
            content = _via_api(api_url, fmt, namespace, since, until)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(content)
            path = out
        else:
            root = (data_dir or Path(os.environ.get("BROKER_DATA_DIR") or "~/.hybrid-broker")).expanduser()
            db_url = db_url or f"sqlite:///{root.resolve() / 'broker.db'}"
            path = write_report(
                out, fmt, database_url=db_url, namespace=namespace, since=since_at, until=until_at, data_dir=root
            )
    except SpecError as exc:
        raise _fail(str(exc), 2) from None
    except BrokerError as exc:
        raise _fail(str(exc), 1) from None
    except OSError as exc:
        raise _fail(f"cannot write {out}: {exc.strerror}. To fix: choose a writable --out path", 1) from None
    print(path)


def register(app: typer.Typer) -> None:
    """Add ``broker report ...`` to the root app."""
    app.add_typer(report_app, name="report")
