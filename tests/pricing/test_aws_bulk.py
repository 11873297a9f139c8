"""AWS Price List bulk files are read incrementally (ijson), with the same answer as a whole-file parse."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from broker.errors import CatalogError
from pricing.aws_bulk import download_to, stream_price_list


def _product(sku: str, itype: str, **attrs: str) -> dict[str, Any]:
    base = {"instanceType": itype, "regionCode": "us-east-1", "operatingSystem": "Linux", "tenancy": "Shared",
            "preInstalledSw": "NA", "capacitystatus": "Used"}
    base.update(attrs)
    return {"sku": sku, "productFamily": "Compute Instance", "attributes": base}


def _term(sku: str, usd: str, unit: str = "Hrs") -> dict[str, Any]:
    return {f"{sku}.JRTCKXETXF": {"offerTermCode": "JRTCKXETXF", "sku": sku, "priceDimensions": {
        f"{sku}.JRTCKXETXF.6YS6EN2CT7": {"unit": unit, "pricePerUnit": {"USD": usd}}}}}


def _offer_file() -> dict[str, Any]:
    products = {
        "A": _product("A", "m5.xlarge"),
        "B": _product("B", "m5.xlarge", operatingSystem="Windows"),  # not Linux
        "C": _product("C", "m5.xlarge", tenancy="Dedicated"),
        "D": _product("D", "p4d.24xlarge"),
        "E": _product("E", "m5.large", regionCode="eu-west-1"),  # another region
        "F": _product("F", "m5.large", capacitystatus="UnusedCapacityReservation"),
        "G": {"sku": "G", "productFamily": "Data Transfer", "attributes": {}},
    }
    terms = {}
    for sku, usd in {"A": "0.1920000000", "B": "0.3760000000", "C": "0.2110000000", "D": "21.9576000000",
                     "E": "0.1070000000", "F": "0.0960000000", "G": "0.0200000000"}.items():
        terms[sku] = _term(sku, usd)
    return {"formatVersion": "v1.0", "offerCode": "AmazonEC2", "version": "20250615000000",
            "publicationDate": "2025-06-15T00:00:00Z", "products": products, "terms": {"OnDemand": terms}}


def test_streamed_parse_equals_the_whole_file_parse(tmp_path: Path) -> None:
    from providers.aws import parse_price_list

    doc = _offer_file()
    f = tmp_path / "index.json"
    f.write_text(json.dumps(doc))
    prices, published = stream_price_list(f, "us-east-1")
    assert prices == {"m5.xlarge": 0.192, "p4d.24xlarge": 21.9576}
    assert prices == parse_price_list(doc, "us-east-1")
    assert published == "2025-06-15T00:00:00Z"
    # key order does not matter (terms before products)
    f.write_text(json.dumps({"terms": doc["terms"], "products": doc["products"]}))
    assert stream_price_list(f, "us-east-1")[0] == prices


@pytest.mark.parametrize(("text", "message"), [
    ('{"products": {"A": {"productFamily": "Storage"}}, "terms": {}}', "no terms.OnDemand"),
    ('{"terms": {"OnDemand": {}}}', "no products"),
    ('{"products": {"A": ', "cannot read the AWS price list"),
])
def test_files_that_are_not_offer_files_say_so(tmp_path: Path, text: str, message: str) -> None:
    f = tmp_path / "index.json"
    f.write_text(text)
    with pytest.raises(CatalogError, match=message):
        stream_price_list(f, "us-east-1")


@pytest.fixture
def served(tmp_path: Path) -> Iterator[str]:
    body = json.dumps(_offer_file()).encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            for i in range(0, len(body), 512):  # several chunks
                self.wfile.write(body[i:i + 512])

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/offers/v1.0/aws/AmazonEC2/current/us-east-1/index.json"
    finally:
        server.shutdown()
        server.server_close()


def test_a_served_bulk_file_is_downloaded_in_chunks_then_parsed(served: str, tmp_path: Path) -> None:
    out = tmp_path / "dl.json"
    with out.open("wb") as f, httpx.stream("GET", served, timeout=10) as resp:
        n = download_to(resp.iter_bytes(chunk_size=256), f)
    assert n == out.stat().st_size > 1000
    assert stream_price_list(out, "us-east-1")[0]["m5.xlarge"] == 0.192
    with out.open("wb") as f, httpx.stream("GET", served, timeout=10) as resp, \
            pytest.raises(CatalogError, match="over 0 MiB"):
        download_to(resp.iter_bytes(chunk_size=256), f, max_bytes=1000)
