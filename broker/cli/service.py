"""`broker` CLI commands of the service: ``serve``, ``submit``, ``jobs ...``, ``namespaces ...``, ``tokens ...``,
``queues ...``.

The client commands talk to ``BROKER_URL`` with ``BROKER_TOKEN`` (see :mod:`broker.client`). The namespace
is ``--namespace``, else ``BROKER_NAMESPACE``, else the token's own namespace; with the admin token ``jobs list``
lists every namespace and the other commands use ``default``.
Errors print one line on stderr and exit non-zero (see :mod:`broker.cli`).
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Annotated, Any

import typer

__all__ = ["register", "serve", "TERMINAL"]

TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}
CHUNK = 500

NamespaceOpt = Annotated[
    str | None, typer.Option("--namespace", "-n", help="namespace (default: BROKER_NAMESPACE or the token's)")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="print JSON")]


def _client() -> Any:
    from broker.client import BrokerClient

    return BrokerClient()


def _namespace(client: Any, namespace: str | None) -> str:
    if namespace:
        return namespace
    env = os.environ.get("BROKER_NAMESPACE")
    if env:
        return env
    who = client.whoami()
    return who.get("namespace") or "default"


def _print_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, sort_keys=False))


def serve(
    host: Annotated[str | None, typer.Option(help="address to listen on (BROKER_HOST)")] = None,
    port: Annotated[int | None, typer.Option(help="port (BROKER_PORT)", min=0, max=65535)] = None,
    data_dir: Annotated[Path | None, typer.Option("--data-dir", help="data directory (BROKER_DATA_DIR)")] = None,
    catalog: Annotated[Path | None, typer.Option("--catalog", help="catalog dir (BROKER_CATALOG_DIR)")] = None,
) -> None:
    """Run the broker (API + scheduler) until SIGTERM/SIGINT."""
    import logging

    import uvicorn

    from broker.app import create_app
    from broker.config import load_settings

    settings = load_settings(host=host, port=port, data_dir=data_dir, catalog_dir=catalog)
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sock = _listen(settings.host, settings.port)  # first: a busy port fails before anything is started
    app = create_app(settings)
    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level="warning", access_log=False,
                            timeout_graceful_shutdown=10, lifespan="on")
    server = _CleanExitServer(config)
    bound = sock.getsockname()[1]
    print(f"broker: serving on http://{settings.host}:{bound} (data {settings.data_dir}, store "
          f"{'postgresql' if app.state.hb.store.is_postgres else 'sqlite'})", file=sys.stderr, flush=True)
    with sock:
        server.run(sockets=[sock])
    print("broker: stopped", file=sys.stderr, flush=True)


def _listen(host: str, port: int) -> Any:
    """A listening socket on ``host:port``; a :class:`BrokerError` saying why when it cannot be had."""
    import socket

    from broker.errors import BrokerError

    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise BrokerError(f"cannot listen on {host}:{port}: {exc.strerror}. To fix: pass --host with an address "
                          "of this machine (BROKER_HOST)") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise BrokerError(f"cannot listen on {host}:{port}: {exc.strerror}. To fix: stop what listens there or "
                          "pass another --port (BROKER_PORT)") from None
    sock.set_inheritable(True)
    return sock


def _clean_exit_server_class() -> Any:
    import contextlib
    from collections.abc import Iterator

    import uvicorn

    class CleanExitServer(uvicorn.Server):
        """uvicorn re-raises SIGTERM after its graceful shutdown (exit status -15); the broker's contract is a
        clean stop, so the captured signal is dropped once shutdown has completed (exit status 0)."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            with super().capture_signals():
                try:
                    yield
                finally:
                    self._captured_signals.clear()

    return CleanExitServer


def _CleanExitServer(config: Any) -> Any:  # noqa: N802 - a class factory, used like a class
    return _clean_exit_server_class()(config)


def _print_job(job: dict[str, Any]) -> None:
    """A readable view of one job (``broker jobs get``)."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    p = job.get("placement") or {}
    head = f"[bold]{job['namespace']}/{job['name']}[/]  {job['id']}  [bold]{job['state']}[/]"
    if job.get("exit_code") is not None:
        head += f"  exit code {job['exit_code']}"
    console.print(head)
    if job.get("held_reason"):
        console.print(f"held: {job['held_reason']}")
    if job.get("message"):
        console.print(f"message: {job['message']}")
    if p:
        mode = " (dry-run)" if job.get("dry_run") else ""
        zone = f"/{p['zone']}" if p.get("zone") else ""
        console.print(
            f"placed on {p['provider']}:{p['region']}{zone} {p['instance_type']} ({p['capacity']}){mode}: "
            f"${p['total_usd']:.4f} = ${p['compute_usd']:.4f} compute (${p['hourly_usd']:.4f}/h) "
            f"+ ${p['egress_usd']:.4f} egress, {p['transfer_hours']:.2f} h of transfer first"
        )
    if job.get("attempts"):
        table = Table(title="provisioning attempts", title_justify="left")
        for col in ("at", "where", "instance type", "outcome", "message"):
            table.add_column(col)
        for a in job["attempts"]:
            table.add_row(a["at"] or "", f"{a['provider']}:{a['region']}", a["instance_type"], a["outcome"],
                          a.get("message") or "")
        console.print(table)
    table = Table(title="events", title_justify="left")
    for col in ("at", "from", "to", "reason"):
        table.add_column(col)
    for e in job.get("events") or []:
        table.add_row(e["at"] or "", e.get("from") or "", e["to"], e.get("reason") or "")
    console.print(table)


def submit(
    files: Annotated[list[Path], typer.Argument(help="job spec files (YAML/JSON; several documents = a burst)")],
    namespace: NamespaceOpt = None,
    wait: Annotated[bool, typer.Option("--wait", help="follow the jobs until they end")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Submit job specs; a burst shows a progress bar. Exit 1 when --wait and a job did not succeed."""
    from rich.progress import Progress

    from broker.spec import load_documents, load_spec_file

    docs: list[dict[str, Any]] = []
    for path in files:
        load_spec_file(path)  # validate locally: errors name the file and field before anything is sent
        docs.extend(load_documents(path.read_bytes()))
    with _client() as client:
        # Without --namespace each spec goes to its own metadata.namespace (else the default namespace);
        # each namespace's specs are one burst, accepted or refused as a whole.
        fallback = _namespace(client, namespace)
        groups: dict[str, list[dict[str, Any]]] = {}
        for doc in docs:
            meta = doc.get("metadata") if isinstance(doc, dict) else None
            own = meta.get("namespace") if isinstance(meta, dict) else None
            groups.setdefault(namespace or (own if isinstance(own, str) and own else fallback), []).append(doc)
        jobs: list[tuple[str, dict[str, Any]]] = []
        with Progress(transient=True, disable=as_json or not sys.stderr.isatty() or len(docs) == 1) as progress:
            task = progress.add_task("submitting", total=len(docs))
            for ns, group in groups.items():
                if len(group) == 1:
                    jobs.append((ns, client.submit(ns, group[0])))
                    progress.advance(task, 1)
                    continue
                for start in range(0, len(group), CHUNK):
                    chunk = group[start : start + CHUNK]
                    jobs.extend((ns, j) for j in client.submit(ns, chunk, idempotency_key=uuid.uuid4().hex)["jobs"])
                    progress.advance(task, len(chunk))
        if not wait:
            if as_json:
                _print_json([j for _, j in jobs])
            else:
                for ns, job in jobs:
                    typer.echo(f"{job['id']}  {ns}/{job['name']}  {job['state']}")
            return
        final: list[dict[str, Any]] = []
        for ns in groups:
            final += follow(client, ns, [j["id"] for n, j in jobs if n == ns], quiet=as_json)
    if as_json:
        _print_json(final)
    else:
        for job in final:
            typer.echo(f"{job['id']}  {job.get('namespace', '')}/{job['name']}  {job['state']}  "
                       f"{job.get('provider') or '-'}{' (dry-run)' if job.get('dry_run') else ''}")
    if any(j["state"] != "SUCCEEDED" for j in final):
        raise typer.Exit(1)


def follow(client: Any, namespace: str, ids: list[str], *, quiet: bool = False, poll_seconds: float = 0.5,
           timeout_seconds: float | None = None) -> list[dict[str, Any]]:
    """Poll until every job of ``ids`` is terminal (Rich progress on a terminal) and return their summaries."""
    from rich.progress import Progress

    wanted = set(ids)
    latest: dict[str, dict[str, Any]] = {}
    started = time.monotonic()
    with Progress(transient=True, disable=quiet or not sys.stderr.isatty()) as progress:
        task = progress.add_task("running", total=len(wanted))
        while True:
            for job in client.iter_jobs(namespace):
                if job["id"] in wanted:
                    latest[job["id"]] = job
            done = sum(1 for i in wanted if latest.get(i, {}).get("state") in TERMINAL)
            progress.update(task, completed=done)
            if done == len(wanted):
                break
            if timeout_seconds is not None and time.monotonic() - started > timeout_seconds:
                break
            time.sleep(poll_seconds)
    return [latest[i] for i in ids if i in latest]


def register(app: typer.Typer) -> None:
    """Add this module's commands to the root app."""
    app.command("serve")(serve)
    app.command("submit")(submit)

    jobs = typer.Typer(help="List, inspect, cancel jobs and read their logs.", no_args_is_help=True)
    namespaces = typer.Typer(help="Manage namespaces (admin).", no_args_is_help=True)
    tokens = typer.Typer(help="Manage API tokens (admin).", no_args_is_help=True)
    queues = typer.Typer(help="Show and set queue disciplines and fair-share weights.", no_args_is_help=True)
    app.add_typer(jobs, name="jobs")
    app.add_typer(namespaces, name="namespaces")
    app.add_typer(tokens, name="tokens")
    app.add_typer(queues, name="queues")

    @jobs.command("list")
    def jobs_list(
        namespace: NamespaceOpt = None,
        state: Annotated[list[str] | None, typer.Option("--state", help="filter by state (repeatable)")] = None,
        label: Annotated[list[str] | None, typer.Option("--label", help="key=value (repeatable)")] = None,
        limit: Annotated[int, typer.Option(min=1, help="at most this many jobs")] = 1000,
        as_json: JsonOpt = False,
    ) -> None:
        """List jobs (newest last). Without a namespace (-n, BROKER_NAMESPACE) a namespace token lists its
        namespace and the admin token lists every namespace (names shown as NAMESPACE/NAME)."""
        with _client() as client:
            chosen = namespace or os.environ.get("BROKER_NAMESPACE")
            who = None if chosen else client.whoami()
            every = who is not None and bool(who.get("admin")) and not who.get("namespace")
            if every:
                spaces = [n["name"] for n in client.list_namespaces()]
            else:
                spaces = [chosen or (who or {}).get("namespace") or "default"]
            out = []
            for ns in spaces:
                for job in client.iter_jobs(ns, states=[s.upper() for s in state or []], labels=label or []):
                    out.append(job)
                    if len(out) >= limit:
                        break
                if len(out) >= limit:
                    break
        if as_json:
            _print_json(out)
            return
        if not out:
            where = f"any of the {len(spaces)} namespaces" if every else f"namespace {spaces[0]!r}"
            filters = " matching the filters" if state or label else ""
            print(f"no jobs{filters} in {where}" + ("" if every or namespace else " (pass -n NAMESPACE for another)"),
                  file=sys.stderr)
            return
        for job in out:
            where = f"{job['provider']}:{job['region']}" if job.get("provider") else "-"
            name = f"{job['namespace']}/{job['name']}" if every else job["name"]
            typer.echo(f"{job['id']}  {name:<30}  {job['state']:<12}  {where}"
                       f"{' (dry-run)' if job.get('dry_run') else ''}")

    @jobs.command("get")
    def jobs_get(job_id: str, namespace: NamespaceOpt = None, as_json: JsonOpt = False) -> None:
        """Show one job: state, where it runs and what it costs, provisioning attempts and its events
        (``--json``: the API's full answer, spec included)."""
        with _client() as client:
            job = client.get_job(_namespace(client, namespace), job_id)
        if as_json:
            _print_json(job)
        else:
            _print_job(job)

    @jobs.command("cancel")
    def jobs_cancel(job_id: str, namespace: NamespaceOpt = None) -> None:
        """Cancel a job (terminates whatever runs for it)."""
        with _client() as client:
            job = client.cancel_job(_namespace(client, namespace), job_id)
        pending = job["state"] != "CANCELLED" and job.get("cancel_requested_at")
        typer.echo(f"{job['id']}  {job['state']}"
                   + ("  (cancel requested: the replica running it stops it; see broker jobs get)" if pending else ""))

    @jobs.command("logs")
    def jobs_logs(
        job_id: str,
        namespace: NamespaceOpt = None,
        stderr: Annotated[bool, typer.Option("--stderr", help="show stderr instead of stdout")] = False,
    ) -> None:
        """Print the output of a job's run: an on-prem run's stdout (or stderr) file, a cloud run's log tail
        (stdout and stderr together) as its VM reported it when it ended."""
        with _client() as client:
            text = client.logs(_namespace(client, namespace), job_id, stream="stderr" if stderr else "stdout")
        typer.echo(text, nl=False)

    @namespaces.command("create")
    def namespaces_create(name: str) -> None:
        """Create a namespace."""
        with _client() as client:
            typer.echo(client.create_namespace(name)["name"])

    @namespaces.command("list")
    def namespaces_list(as_json: JsonOpt = False) -> None:
        """List namespaces."""
        with _client() as client:
            spaces = client.list_namespaces()
        if as_json:
            _print_json(spaces)
            return
        for ns in spaces:
            typer.echo(ns["name"])

    @tokens.command("create")
    def tokens_create(
        namespace: Annotated[str, typer.Option("--namespace", "-n", help="namespace of the token")],
        description: Annotated[str, typer.Option(help="what the token is for")] = "",
        as_json: JsonOpt = False,
    ) -> None:
        """Create a namespace token; prints the secret once (store it now)."""
        with _client() as client:
            answer = client.create_token(namespace, description)
        if as_json:
            _print_json(answer)
            return
        typer.echo(answer["token"])
        print(f"token id {answer['id']} for namespace {namespace} (the secret above is shown only once)",
              file=sys.stderr)

    @tokens.command("list")
    def tokens_list(namespace: Annotated[str, typer.Option("--namespace", "-n")], as_json: JsonOpt = False) -> None:
        """List a namespace's tokens (no secrets)."""
        with _client() as client:
            tokens = client.list_tokens(namespace)
        if as_json:
            _print_json(tokens)
            return
        for tok in tokens:
            state = f"revoked {tok['revoked_at']}" if tok.get("revoked_at") else "active"
            typer.echo(f"{tok['id']}  {state}  {tok.get('description') or ''}")

    @tokens.command("revoke")
    def tokens_revoke(token_id: str) -> None:
        """Revoke a token."""
        with _client() as client:
            answer = client.revoke_token(token_id)
        typer.echo(f"{answer['id']}  revoked")

    @queues.command("get")
    def queues_get(
        namespace: Annotated[str | None, typer.Argument(help="namespace (none: the cluster setting, admin)")] = None,
        as_json: JsonOpt = False,
    ) -> None:
        """Show a namespace's queue (discipline, weight, usage, dominant share), or the cluster's."""
        with _client() as client:
            answer = client.get_queue(namespace)
        if as_json:
            _print_json(answer)
        else:
            typer.echo(_queue_text(answer, namespace))

    @queues.command("set")
    def queues_set(
        namespace: Annotated[str | None, typer.Argument(help="namespace (none: the cluster setting)")] = None,
        discipline: Annotated[str | None, typer.Option(
            "--discipline", help="fifo | priority | fair-share | edf (or default)")] = None,
        weight: Annotated[float | None, typer.Option(
            "--weight", help="fair-share weight of the namespace (>= 0; 0 = only leftovers)")] = None,
        half_life: Annotated[float | None, typer.Option(
            "--half-life", help="cluster only: half-life of fair-share usage, in seconds")] = None,
        as_json: JsonOpt = False,
    ) -> None:
        """Set a namespace's discipline and/or weight, or (no NAMESPACE) the cluster discipline and/or
        half-life (admin). Settings left out keep their value."""
        from broker.errors import SpecError

        if discipline is None and weight is None and half_life is None:
            raise SpecError("", "nothing to set. To fix: pass --discipline, --weight or --half-life")
        if namespace is None and weight is not None:
            raise SpecError("weight", "a weight belongs to a namespace. To fix: broker queues set NAMESPACE "
                            "--weight W")
        if namespace is not None and half_life is not None:
            raise SpecError("halfLifeSeconds", "the half-life is a cluster setting. To fix: broker queues set "
                            "--half-life S (without a namespace)")
        with _client() as client:
            answer = client.set_queue(namespace, discipline=discipline, weight=weight, half_life_seconds=half_life)
        if as_json:
            _print_json(answer)
        else:
            typer.echo(_queue_text(answer, namespace))


def _queue_text(answer: dict[str, Any], namespace: str | None) -> str:
    """The human form of a queue answer of the API (namespace or cluster)."""
    if namespace is None:
        lines = [f"cluster  discipline {answer['discipline']}  half-life {answer['halfLifeSeconds']:g}s"]
        for ns, setting in answer.get("namespaces", {}).items():
            lines.append(f"{ns}  discipline {setting['discipline']}  weight {setting['weight']:g}")
        return "\n".join(lines)
    share = answer.get("dominantShare") or {}
    usage = answer.get("usage") or {}
    return (
        f"{answer['namespace']}  discipline {answer['discipline']}"
        f"{'' if answer.get('configured') else ' (cluster default)'}  weight {answer['weight']:g}\n"
        f"usage  {usage.get('cpu_hours', 0):.3g} cpu-h  {usage.get('memory_gib_hours', 0):.3g} GiB-h  "
        f"{usage.get('gpu_hours', 0):.3g} gpu-h  dominant share {share.get('share', 0):.3g} "
        f"({share.get('resource') or '-'})"
    )
