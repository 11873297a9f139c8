"""The ``broker`` command line. Each command group lives in its own module under ``broker.cli``.

Errors print one line on stderr and exit non-zero (2: invalid input, 3: nothing feasible,
1: anything else); never a traceback for a user mistake.
"""

from __future__ import annotations

import sys

__all__ = ["main", "app"]

try:
    import typer
except ImportError:  # pragma: no cover - only without the server extra
    typer = None  # type: ignore[assignment]


def _build_app() -> typer.Typer:
    from broker.cli import catalog, edge, ops, place, policies, providers, report, service

    app = typer.Typer(
        name="broker",
        help="hybrid-broker: place and run jobs where they are cheapest in total, across clouds, "
        "on-prem and edge.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        context_settings={"help_option_names": ["-h", "--help"]},
    )
    place.register(app)
    catalog.register(app)
    providers.register(app)
    service.register(app)
    policies.register(app)
    edge.register(app)
    report.register(app)
    ops.register(app)
    return app


def main(argv: list[str] | None = None) -> None:
    if typer is None:  # pragma: no cover
        print(
            "error: the broker needs the server extra. To fix: pip install 'hybrid-broker[server]'",
            file=sys.stderr,
        )
        raise SystemExit(1)
    from broker.errors import BrokerError, SpecError

    app = _build_app()
    try:
        app(args=argv, standalone_mode=True)
    except SpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    except BrokerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None


def __getattr__(name: str) -> object:
    if name == "app":
        return _build_app()
    raise AttributeError(name)
