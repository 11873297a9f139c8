"""The ``broker`` command line. Each command group lives in its own module under ``broker.cli``.

Errors print one line on stderr and exit non-zero (2: invalid input, 3: nothing feasible,
1: anything else); never a traceback for a user mistake.
"""

from __future__ import annotations

import sys
from typing import Any

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
    @app.callback()
    def _root(
        version: bool = typer.Option(False, "--version", is_eager=True, callback=_print_version,
                                     help="Print the version and exit."),
    ) -> None:
        """hybrid-broker: place and run jobs where they are cheapest in total, across clouds, on-prem and edge."""

    _hide_flag_types()
    place.register(app)
    catalog.register(app)
    providers.register(app)
    service.register(app)
    policies.register(app)
    edge.register(app)
    report.register(app)
    ops.register(app)
    return app


def _print_version(value: bool) -> None:
    if value:
        from broker import __version__

        typer.echo(f"broker (hybrid-broker) {__version__}")
        raise typer.Exit()


def _hide_flag_types() -> None:
    """Typer >= 0.16 shows the type ``<bool>`` beside every flag in ``--help``; a flag takes no value, so
    the column stays empty for flags (a value-taking option still shows ``<int>``, ``<path>``...)."""
    from typer.core import TyperOption

    if getattr(TyperOption.display_type_rich, "_hb_flags_hidden", False):
        return
    original = TyperOption.display_type_rich

    def display_type_rich(self: TyperOption, ctx: Any) -> str | None:
        if self.is_flag and not self.count:
            return None
        return original(self, ctx)

    display_type_rich._hb_flags_hidden = True  # type: ignore[attr-defined]
    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign,assignment]


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
