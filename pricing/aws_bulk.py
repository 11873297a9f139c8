"""Streamed reading of an AWS Price List bulk offer file (``offers/v1.0/aws/AmazonEC2/current/<region>/index.json``).

A region's ``AmazonEC2`` file is several hundred MB of JSON: ``{"publicationDate", "products": {sku: {...}},
"terms": {"OnDemand": {sku: {offerTermCode: {"priceDimensions": {...}}}}, "Reserved": {...}}}``. Loading it
whole takes gigabytes; here it is read with ``ijson`` (a C-backed incremental parser) in two passes over the
file, keeping only the SKUs that can price an offer (memory ~ the few thousand matching products).

Selection (as :func:`providers.aws.parse_price_list`): ``productFamily`` *Compute Instance* (or bare metal),
``regionCode`` the region, Linux, Shared tenancy, no pre-installed software, ``capacitystatus`` Used; the
price is the ``Hrs`` dimension of the OnDemand term (the lowest when a SKU has several).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from decimal import Decimal
from pathlib import Path
from typing import IO, Any

from broker.errors import CatalogError

__all__ = ["stream_price_list", "download_to"]

_FAMILIES = ("Compute Instance", "Compute Instance (bare metal)")


def _wanted(product: Mapping[str, Any], region: str) -> str | None:
    """The instance type of a product that prices an on-demand Linux offer in ``region``, else ``None``."""
    attrs = product.get("attributes") or {}
    if product.get("productFamily") not in _FAMILIES or attrs.get("regionCode", region) != region:
        return None
    if (attrs.get("operatingSystem"), attrs.get("tenancy"), attrs.get("preInstalledSw", "NA")) != (
        "Linux", "Shared", "NA"
    ):
        return None
    if attrs.get("capacitystatus", "Used") != "Used":
        return None
    return attrs.get("instanceType") or None


def stream_price_list(path: str | Path, region: str) -> tuple[dict[str, float], str]:
    """``({instance type: on-demand Linux USD/hour}, publication date)`` of the bulk file at ``path``.

    Raises :class:`CatalogError` when the file is not an offer file (no ``products`` or no OnDemand terms)."""
    import ijson

    p = Path(path)
    skus: dict[str, str] = {}
    header: dict[str, str] = {}
    try:
        with p.open("rb") as f:
            for prefix, event, value in ijson.parse(f):
                if prefix in ("publicationDate", "version") and event == "string":
                    header[prefix] = value
                if prefix in ("products", "terms"):  # the header fields come first in AWS files
                    break
        published = header.get("publicationDate") or header.get("version") or ""
        with p.open("rb") as f:
            seen_products = False
            for sku, product in ijson.kvitems(f, "products"):
                seen_products = True
                itype = _wanted(product, region)
                if itype:
                    skus[sku] = itype
        if not seen_products:
            raise CatalogError(f"{p}: no products. To fix: point price_list_url at an AmazonEC2 bulk offer file "
                               "(offers/v1.0/aws/AmazonEC2/current/<region>/index.json)")
        out: dict[str, float] = {}
        seen_terms = False
        with p.open("rb") as f:
            for sku, terms in ijson.kvitems(f, "terms.OnDemand"):
                seen_terms = True
                itype = skus.get(sku)
                if itype is None:
                    continue
                for usd in _hourly(terms.values()):
                    if usd > 0:
                        out[itype] = min(usd, out.get(itype, usd))
        if not seen_terms:
            raise CatalogError(f"{p}: no terms.OnDemand. To fix: use an AmazonEC2 bulk offer file")
    except (OSError, ValueError, ijson.JSONError) as exc:  # broken JSON: ijson's IncompleteJSONError
        raise CatalogError(f"cannot read the AWS price list {p}: {exc}") from None
    return out, published


def _hourly(terms: Iterable[Mapping[str, Any]]) -> Iterable[float]:
    for term in terms:
        for dim in (term.get("priceDimensions") or {}).values():
            if dim.get("unit") != "Hrs":
                continue
            try:
                raw = dim["pricePerUnit"]["USD"]
                yield float(raw if not isinstance(raw, Decimal) else str(raw))
            except (KeyError, TypeError, ValueError):
                continue


def download_to(stream: Iterable[bytes], out: IO[bytes], *, max_bytes: int = 8 << 30) -> int:
    """Copy an HTTP body (``httpx.Response.iter_bytes()``) to ``out`` chunk by chunk; bytes written. Raises
    :class:`CatalogError` past ``max_bytes`` (a runaway or wrong URL)."""
    n = 0
    for chunk in stream:
        n += len(chunk)
        if n > max_bytes:
            raise CatalogError(f"the AWS price list is over {max_bytes >> 20} MiB. To fix: check the URL")
        out.write(chunk)
    return n
