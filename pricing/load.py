"""``load_catalog``: the embedded default merged with SkyPilot-v8 catalogs, cached as ``.npz``.

Design choice: parsing ~90k CSV rows and Libcloud's 4.5 MB JSON takes a few hundred milliseconds; the parsed
arrays are cached under ``<cache dir>/catalog-<key>.npz`` where the key hashes every source file's path,
size and mtime plus the Libcloud and loader versions, so a changed file is re-read and a stale cache is
never used. Cache dir: ``$BROKER_DATA_DIR/cache`` or ``~/.cache/hybrid-broker``; never the repository.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from broker.errors import CatalogError
from pricing.catalog import Catalog
from pricing.embedded import LIST_PRICES_PATH, _libcloud_version, libcloud_pricing_path, load_embedded
from pricing.skypilot import load_skypilot_dir, skypilot_files

__all__ = ["load_catalog", "cache_dir", "LOADER_VERSION"]

LOADER_VERSION = "2"  # bump when loaders change what they produce


def cache_dir() -> Path:
    """Where parsed catalogs are cached: ``$BROKER_DATA_DIR/cache`` or ``~/.cache/hybrid-broker``."""
    data = os.environ.get("BROKER_DATA_DIR")
    return Path(data).expanduser() / "cache" if data else Path.home() / ".cache" / "hybrid-broker"


def _stamp(path: Path) -> str:
    st = path.stat()
    return f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}"


def load_catalog(catalog_dir: str | Path | None = None, *, include_embedded: bool = True,
                 use_cache: bool = True) -> Catalog:
    """The catalog to place against.

    ``catalog_dir`` (``None`` -> ``$BROKER_CATALOG_DIR`` if set, else none) is a SkyPilot-v8 directory merged
    over the embedded default (the loaded catalog wins where both price the same offer). With
    ``include_embedded=False`` only the directory is loaded. Raises :class:`CatalogError` when a named
    directory is missing or unreadable, or when nothing at all would be loaded.
    """
    if catalog_dir is None:
        catalog_dir = os.environ.get("BROKER_CATALOG_DIR") or None
    files = skypilot_files(catalog_dir) if catalog_dir is not None else []
    if not include_embedded and not files:
        raise CatalogError("no catalog to load. To fix: pass a catalog directory or include the embedded one")
    code = hashlib.sha256()
    for mod in ("catalog.py", "embedded.py", "skypilot.py", "load.py", "geo.py"):
        code.update((Path(__file__).parent / mod).read_bytes())
    parts = [f"loader={LOADER_VERSION}:{code.hexdigest()[:12]}", f"embedded={include_embedded}"]
    if include_embedded:
        parts.append(f"libcloud={_libcloud_version()}:{_stamp(libcloud_pricing_path())}")
        parts.append(f"list-prices={_stamp(LIST_PRICES_PATH)}")
    parts.extend(f"{prov}={_stamp(p)}" for prov, p in files)
    key = hashlib.sha256("|".join(parts).encode()).hexdigest()[:20]
    cpath = cache_dir() / f"catalog-{key}.npz"
    if use_cache and cpath.is_file():
        try:
            return Catalog.load_npz(cpath)
        except CatalogError:
            pass  # unreadable cache: rebuild below
    cat: Catalog | None = load_embedded() if include_embedded else None
    if catalog_dir is not None:
        loaded = load_skypilot_dir(catalog_dir)
        cat = loaded if cat is None else cat.merged_with(loaded)
    assert cat is not None
    if use_cache:
        try:
            cpath.parent.mkdir(parents=True, exist_ok=True)
            cat.save_npz(cpath)
        except OSError:
            pass  # a read-only home is fine: we just do not cache
    return cat
