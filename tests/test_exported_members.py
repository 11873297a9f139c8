"""Each package's public names are pinned: a change to ``__all__`` is a change to the API, made on purpose."""

from __future__ import annotations

import importlib

import pytest

EXPECTED = {
    "broker": ["__version__"],
    "broker.ops": [
        "store", "samples", "collect", "rules", "anomaly", "alerts", "topology", "webhooks",
        "forecast", "autoscale", "poolsim", "vpa", "probes", "health", "replay", "history", "service",
    ],
    "policies": [
        "place", "queue_key", "order", "admit", "find_victims", "place_gang", "choose_pool",
        "choose_for_deadline", "solve_heuristic", "solve_exact",
    ],
}


@pytest.mark.parametrize("package", sorted(EXPECTED))
def test_the_public_names_are_pinned(package: str) -> None:
    assert importlib.import_module(package).__all__ == EXPECTED[package]


@pytest.mark.parametrize(
    "package", ["broker", "broker.model", "broker.errors", "broker.ops", "pricing", "providers", "policies", "edge"]
)
def test_every_public_name_resolves(package: str) -> None:
    module = importlib.import_module(package)
    for name in module.__all__:
        # a name is an attribute, or (edge lists its parts) a submodule
        value = getattr(module, name, None) or importlib.import_module(f"{package}.{name}")
        assert value is not None, f"{package}.{name}"


def test_importing_broker_pulls_no_third_party_module() -> None:
    import subprocess
    import sys

    code = (
        "import sys, broker, broker.model, broker.errors, broker.spec\n"
        "heavy = {'fastapi', 'sqlmodel', 'numpy', 'typer', 'sqlalchemy'} & set(sys.modules)\n"
        "print(sorted(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
