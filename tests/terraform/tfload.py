"""Load the Terraform tree under terraform/ with python-hcl2 into plain dicts (no terraform binary needed)."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hcl2
from hcl2 import SerializationOptions

__all__ = ["REPO", "TERRAFORM", "blocks", "config_keys", "load", "module_dirs", "tf_files", "unquote"]

REPO = Path(__file__).resolve().parents[2]
TERRAFORM = REPO / "terraform"
_OPTS = SerializationOptions(strip_string_quotes=True, explicit_blocks=False, with_comments=False)


def tf_files() -> list[Path]:
    return sorted(TERRAFORM.rglob("*.tf"))


def module_dirs() -> list[Path]:
    return sorted({p.parent for p in tf_files()})


@functools.cache
def load(path: Path) -> dict[str, Any]:
    """One .tf file as a dict; raises lark's UnexpectedToken/UnexpectedCharacters on a syntax error."""
    with path.open() as fh:
        return dict(hcl2.load(fh, serialization_options=_OPTS))


def blocks(directory: Path, kind: str) -> Iterator[tuple[str, Any]]:
    """(name, body) of every top-level block of one kind (variable, output, locals...) in a module.

    Two-label blocks (resource, data) come back as name "type.name"."""
    for path in sorted(directory.glob("*.tf")):
        for entry in load(path).get(kind, []):
            if kind in {"resource", "data"}:
                for rtype, named in entry.items():
                    for name, body in named.items():
                        yield f"{rtype}.{name}", body
            elif kind == "locals":
                yield from entry.items()
            else:
                yield from entry.items()


def unquote(value: Any) -> Any:
    return value.strip('"') if isinstance(value, str) else value


def config_keys() -> dict[str, str]:
    """BROKER_* keys of docs/CONFIG.md's first table (the server's keys, which a deployment sets) -> their
    documented default (text of the second column). Later sections (provider adapter and development keys)
    are set through the modules' ``extra_environment`` and are not part of this contract."""
    keys: dict[str, str] = {}
    for line in (REPO / "docs" / "CONFIG.md").read_text().splitlines():
        if line.startswith("## "):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3:
            continue
        names = re.findall(r"`(BROKER_[A-Z_]+)`", cells[0])
        # A default is literal only when the cell is code (`8080`); prose ("unset (only `localhost`)") is not.
        defaults = re.findall(r"`([^`]*)`", cells[1]) if cells[1].startswith("`") else []
        for i, name in enumerate(names):
            keys[name] = defaults[min(i, len(defaults) - 1)] if defaults else cells[1]
    return keys
