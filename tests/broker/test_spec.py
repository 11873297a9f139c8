"""broker/spec.py: job specs parsed as Kubernetes would, and every kind of bad input refused by field."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
import yaml

from broker.errors import SpecError
from broker.model import SpotPolicy
from broker.spec import (
    load_spec_file,
    parse_cpu,
    parse_job_spec,
    parse_memory_gib,
    spec_to_dict,
    specs_from_payload,
)

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def make_doc(**spec: object) -> dict[str, object]:
    base: dict[str, object] = {
        "command": ["python", "train.py"],
        "resources": {"requests": {"cpu": "8", "memory": "32Gi"}},
        "durationHours": 3,
    }
    base.update(spec)
    return {"apiVersion": "hybrid-broker/v1", "kind": "Job", "metadata": {"name": "train-1"}, "spec": base}


@pytest.mark.parametrize(
    ("text", "cores"),
    [("500m", 0.5), ("1.5", 1.5), ("8", 8.0), (2, 2.0), ("1e1", 10.0), ("2k", 2000.0)],
    ids=["millicores", "decimal cores", "whole cores", "a bare int", "an exponent", "a decimal SI suffix"],
)
def test_cpu_quantities_parse_as_kubernetes_does(text: object, cores: float) -> None:
    assert parse_cpu(text, "cpu") == pytest.approx(cores)


@pytest.mark.parametrize(
    ("text", "gib"),
    [("32Gi", 32.0), ("512Mi", 0.5), ("1Ti", 1024.0), ("1G", 1e9 / 2**30), (str(2**31), 2.0)],
    ids=["binary GiB", "binary MiB", "binary TiB", "decimal G", "plain bytes"],
)
def test_memory_quantities_become_gib(text: object, gib: float) -> None:
    assert parse_memory_gib(text, "memory") == pytest.approx(gib)


def test_a_full_spec_becomes_the_request_placement_reads() -> None:
    doc = make_doc(
        deadline="2026-12-03T06:00:00Z",
        data=[{"uri": "s3://b/set", "location": "aws:us-east-1", "sizeGiB": 500}],
        placement={"providers": ["aws", "gcp"], "spot": "allowed", "maxHourlyUSD": 40},
        resources={"requests": {"cpu": "8", "memory": "32Gi"}, "limits": {"nvidia.com/gpu": 2}, "accelerator": "a100"},
        checkpoint={"path": "/ckpt", "intervalMinutes": 5},
    )
    spec = parse_job_spec(doc, now=NOW)
    r = spec.request
    assert (r.vcpus, r.memory_gib, r.gpus, r.accelerator) == (8.0, 32.0, 2, "A100")
    assert r.spot is SpotPolicy.ALLOWED and r.max_hourly_usd == 40 and r.providers == ("aws", "gcp")
    assert r.deadline == datetime(2026, 12, 3, 6, tzinfo=UTC)
    assert r.data[0].location == "aws:us-east-1" and r.data[0].size_gib == 500
    assert spec.checkpoint is not None and spec.checkpoint.interval_minutes == 5
    assert spec.command == ("python", "train.py")


def test_a_spec_round_trips_through_its_stored_form() -> None:
    spec = parse_job_spec(make_doc(deadline="2026-12-03T06:00:00Z"), now=NOW)
    again = parse_job_spec(spec_to_dict(spec), now=NOW)
    assert again.request == spec.request and again.command == spec.command


def test_yaml_timestamps_and_strings_give_the_same_deadline() -> None:
    text = yaml.safe_dump(make_doc()).replace("durationHours: 3", "durationHours: 3\n  deadline: 2026-12-03 06:00:00")
    assert parse_job_spec(text, now=NOW).request.deadline == datetime(2026, 12, 3, 6, tzinfo=UTC)


BOMB = 'a: &a ["x","x","x","x","x","x","x","x","x"]\n' + "".join(
    [f"{c}: &{c} [" + ",".join([f"*{p}"] * 9) + "]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True)]
)


@pytest.mark.parametrize(
    ("doc", "field", "words"),
    [
        ("spec: [unclosed", "", "malformed YAML"),
        (make_doc(durationHour=3), "spec.durationHour", "unknown field"),
        (make_doc(resources={"requests": {"memory": "32GB"}}), "spec.resources.requests.memory", "32Gi"),
        (make_doc(resources={"requests": {"cpu": "-2"}}), "spec.resources.requests.cpu", "negative"),
        (make_doc(resources={"requests": {"cpu": "90000"}}), "spec.resources.requests.cpu", "most a job may ask"),
        (make_doc(resources={"requests": {"memory": 32}}), "spec.resources.requests.memory", "32Gi"),
        (make_doc(resources={"accelerator": "Z900"}), "spec.resources.accelerator", "unknown accelerator"),
        (make_doc(deadline="2020-01-01T00:00:00Z"), "spec.deadline", "in the past"),
        (make_doc(deadline="tomorrow"), "spec.deadline", "ISO 8601"),
        (make_doc(data=[{"location": "mars:olympus", "sizeGiB": 1}]), "spec.data[0].location", "unknown provider"),
        (make_doc(data=[{"location": "aws", "sizeGiB": 1}]), "spec.data[0].location", "provider:region"),
        (make_doc(data=[{"location": "aws:us-east-1", "sizeGiB": -1}]), "spec.data[0].sizeGiB", "out of range"),
        (make_doc(placement={"spot": "sometimes"}), "spec.placement.spot", "never, allowed or required"),
        (make_doc(durationHours=0), "spec.durationHours", "more than 0"),
        (make_doc(nodes=1.5), "spec.nodes", "whole number"),
        ({"metadata": {"name": "Bad_Name"}, "spec": {}}, "metadata.name", "lowercase"),
        ({"spec": {}}, "metadata.name", "required"),
        (["not", "a", "mapping"], "document", "mapping"),
        (BOMB, "", "YAML bomb"),
    ],
    ids=[
        "malformed YAML",
        "an unknown field",
        "GB instead of Gi",
        "negative cpu",
        "an absurd cpu count",
        "memory without a unit",
        "an unknown accelerator",
        "a deadline in the past",
        "a deadline that is not a time",
        "a data location on an unknown provider",
        "a data location without a region",
        "a negative data size",
        "a bad spot policy",
        "a zero duration",
        "a fractional node count",
        "an invalid name",
        "a missing name",
        "a list where a mapping belongs",
        "a YAML bomb",
    ],
)
def test_bad_input_is_refused_naming_the_field(doc: object, field: str, words: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_job_spec(doc, now=NOW)  # type: ignore[arg-type]
    assert err.value.field == field
    assert words in str(err.value)


def test_a_data_location_missing_from_the_catalog_is_refused() -> None:
    doc = make_doc(data=[{"location": "aws:moon-1", "sizeGiB": 1}])
    with pytest.raises(SpecError, match="does not exist"):
        parse_job_spec(doc, now=NOW, location_exists=lambda key: key == "aws:us-east-1")


def test_a_burst_reports_the_index_of_the_bad_item() -> None:
    good, bad = make_doc(), make_doc(resources={"requests": {"memory": "1GB"}})
    with pytest.raises(SpecError) as err:
        specs_from_payload([good, bad], now=NOW)
    assert err.value.field == "[1].spec.resources.requests.memory"
    assert len(specs_from_payload({"jobs": [good, good]}, now=NOW)) == 2


def test_a_file_with_several_documents_is_a_burst(tmp_path) -> None:  # type: ignore[no-untyped-def]
    f = tmp_path / "burst.yaml"
    f.write_text(yaml.safe_dump(make_doc()) + "---\n" + yaml.safe_dump(make_doc()))
    assert [s.name for s in load_spec_file(f, now=NOW)] == ["train-1", "train-1"]
    with pytest.raises(SpecError, match="no such file"):
        load_spec_file(tmp_path / "missing.yaml")
