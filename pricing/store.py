"""Versioned catalog storage: every catalog ever used stays loadable, so history is never re-priced.

Layout under ``<data_dir>/catalogs/``: ``<version>.npz`` per catalog and ``index.json``, a list of
``{version, created_at, label}`` in save order. Saving the same content twice is idempotent (same version,
one index entry). Writers use atomic renames; one writer at a time is assumed (the broker process).
"""

from __future__ import annotations

import json
import os
import re
from datetime import UTC, datetime
from pathlib import Path

from broker.errors import CatalogError, NotFoundError
from pricing.catalog import Catalog

__all__ = ["CatalogStore"]

_VERSION_RE = re.compile(r"^[0-9A-Za-z._-]{1,80}$")


class CatalogStore:
    """Catalog versions kept under ``data_dir`` (see module docstring)."""

    def __init__(self, data_dir: str | Path) -> None:
        self.root = Path(data_dir).expanduser() / "catalogs"

    def _index_path(self) -> Path:
        return self.root / "index.json"

    def _index(self) -> list[dict[str, str]]:
        p = self._index_path()
        if not p.is_file():
            return []
        try:
            data = json.loads(p.read_text())
        except (OSError, ValueError) as exc:
            raise CatalogError(f"catalog index {p} is unreadable: {exc}. To fix: restore or delete it") from exc
        return list(data)

    def save(self, catalog: Catalog, label: str = "") -> str:
        """Store ``catalog`` (idempotent by content) and return its version."""
        version = catalog.version
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.root / f"{version}.npz"
        if not path.is_file():  # written aside and renamed: replicas sharing a data dir may save at once
            part = self.root / f"{version}.{os.getpid()}.part.npz"
            catalog.save_npz(part)
            os.replace(part, path)
        idx = self._index()
        if not any(e["version"] == version for e in idx):
            idx.append({"version": version, "created_at": datetime.now(UTC).isoformat(), "label": label})
            tmp = self._index_path().with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(idx, indent=1))
            tmp.replace(self._index_path())
        return version

    def load(self, version: str) -> Catalog:
        """The catalog saved as ``version``; :class:`NotFoundError` when there is none."""
        if not _VERSION_RE.match(version):
            raise NotFoundError(f"catalog version {version!r} is not a valid version string")
        path = self.root / f"{version}.npz"
        if not path.is_file():
            raise NotFoundError(f"catalog version {version} is not stored in {self.root}. "
                                "To fix: list versions with CatalogStore.versions()")
        return Catalog.load_npz(path)

    def versions(self) -> list[tuple[str, str, str]]:
        """``(version, created_at ISO, label)`` in save order (oldest first)."""
        return [(e["version"], e["created_at"], e.get("label", "")) for e in self._index()]

    def current(self) -> str | None:
        """The most recently saved version, or ``None`` when nothing was saved."""
        idx = self._index()
        return idx[-1]["version"] if idx else None
