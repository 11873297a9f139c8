"""`broker place` and `broker catalog` end to end through the real entry point (in-process): the JSON
contract, exit codes, every bad input of issue 2 (exit 2, one line naming the field, no traceback)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.cli import main
from broker.model import PlacementOption
from tests.pricing.catalog_builders import SKY_V8

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
JOB = """\
apiVersion: hybrid-broker/v1
kind: Job
metadata: {{name: {name}}}
spec:
  command: [echo, hi]
  resources:
    requests: {{cpu: "{cpu}", memory: {memory}}}
{extra}
"""


@pytest.fixture(autouse=True)
def _isolated(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("BROKER_DATA_DIR", str(tmp_path_factory.getbasetemp() / "cli-data"))
    for var in ("BROKER_CATALOG_DIR", "BROKER_INVENTORY", "BROKER_EGRESS_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    yield


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(args)
        raise SystemExit(0)
    out = capsys.readouterr()
    code = exc.value.code
    return (code if isinstance(code, int) else (0 if code is None else 1)), out.out, out.err


def spec(tmp_path: Path, text: str, name: str = "job.yaml") -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def job(name: str = "j1", cpu: str = "2", memory: str = "4Gi", extra: str = "") -> str:
    return JOB.format(name=name, cpu=cpu, memory=memory, extra=extra)


def test_place_json_contract(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = job(cpu="4", memory="16Gi", extra="  placement: {providers: [aws, gcp, azure]}")
    code, out, err = run(["place", spec(tmp_path, text), "--json", "--top", "3"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert set(doc) == {"job", "placement", "alternatives", "considered", "feasible", "rejected", "explanation"}
    assert doc["job"] == "j1" and len(doc["alternatives"]) == 3
    best, runner = doc["placement"], doc["alternatives"][0]
    assert doc["explanation"].startswith(f"{best['provider']}:{best['region']}")
    assert f"runner-up {runner['provider']}:{runner['region']}" in doc["explanation"]
    for opt in (doc["placement"], *doc["alternatives"]):
        assert tuple(opt) == PlacementOption.CONTRACT_KEYS
        assert opt["capacity"] in ("on-demand", "spot", "owned")
        assert opt["vcpus"] >= 4 and opt["memory_gib"] >= 16
        assert opt["total_usd"] == pytest.approx(opt["compute_usd"] + opt["egress_usd"])
    assert doc["considered"] == doc["feasible"] + sum(doc["rejected"].values())


def test_no_feasible_placement_exits_3_with_null_placement(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = job(cpu="4", extra="  placement: {maxHourlyUSD: 0.0001, providers: [aws]}")
    code, out, _ = run(["place", spec(tmp_path, text), "--json"], capsys)
    assert code == 3
    doc = json.loads(out)
    assert doc["placement"] is None and doc["alternatives"] == [] and doc["rejected"]["OverPriceCap"] > 0
    top_reason, count = max(doc["rejected"].items(), key=lambda kv: kv[1])
    assert doc["explanation"].startswith(f"No feasible placement among {doc['considered']} offers")
    assert f"{top_reason} ({count})" in doc["explanation"]


def test_several_documents_give_one_json_line_each(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = job("a") + "---\n" + job("b", cpu="8", memory="32Gi")
    code, out, _ = run(["place", spec(tmp_path, text), "--json", "--top", "1"], capsys)
    assert code == 0
    docs = [json.loads(line) for line in out.splitlines()]
    assert [d["job"] for d in docs] == ["a", "b"]


def test_human_output_is_a_table_with_the_explanation(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["place", spec(tmp_path, job(cpu="4", memory="16Gi")), "--top", "2"], capsys)
    assert code == 0
    assert "best" in out and "total $" in out and "wins at $" in out


BAD = [
    ("apiVersion: hybrid-broker/v1\nkind: Job\nmetadata: {name: x\n", ""),
    (job(extra="  colour: blue"), "spec.colour"),
    (job(memory="32GB"), "spec.resources.requests.memory"),
    (job(cpu="-2"), "spec.resources.requests.cpu"),
    (job(cpu="100000000"), "spec.resources.requests.cpu"),
    (job(extra="    accelerator: Z9000"), "spec.resources.accelerator"),
    (job(extra='  deadline: "2001-01-01T00:00:00Z"'), "spec.deadline"),
    (job(extra="  data:\n    - {uri: s3://b/x, location: 'aws:mars-north-1', sizeGiB: 5}"), "spec.data[0].location"),
    (job(extra="  data:\n    - {uri: s3://b/x, location: 'onprem:nowhere', sizeGiB: 5}"), "spec.data[0].location"),
    ("a: &a [x,x,x,x,x,x,x,x,x,x]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
     "d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c]\ne: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d,*d]\n"
     "f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e,*e]\ng: [*f,*f,*f,*f,*f,*f,*f,*f,*f,*f]\n", ""),
]


@pytest.mark.parametrize(
    ("text", "field"),
    BAD,
    ids=["malformed yaml", "an unknown field", "memory in GB instead of Gi", "a negative cpu",
         "an absurd cpu count", "an unknown accelerator", "a deadline in the past",
         "a cloud data location that does not exist", "an on-prem site that does not exist", "a yaml bomb"],
)
def test_bad_input_exits_2_with_one_line_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, field: str
) -> None:
    code, out, err = run(["place", spec(tmp_path, text), "--json"], capsys)
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ")
    assert "Traceback" not in err
    if field:
        assert field in lines[0]


def test_a_missing_spec_file_and_a_bad_catalog_dir_are_one_line_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(["place", str(tmp_path / "nope.yaml")], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "no such file" in err
    code, _, err = run(["place", spec(tmp_path, job()), "--catalog", str(tmp_path / "no-dir")], capsys)
    assert code == 1 and len(err.strip().splitlines()) == 1 and "does not exist" in err


def test_catalog_offers_filters_and_sorts(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["catalog", "offers", "--gpu", "A100:8", "--provider", "aws", "--json", "--limit", "5"],
                         capsys)
    assert code == 0, err
    rows = json.loads(out)
    assert 0 < len(rows) <= 5
    assert all(r["accelerator"] == "A100" and r["gpus"] >= 8 and r["provider"] == "aws" for r in rows)
    assert [r["hourly_usd"] for r in rows] == sorted(r["hourly_usd"] for r in rows)
    code, out, _ = run(["catalog", "offers", "--spot", "--min-vcpus", "4", "--min-memory", "16",
                        "--region", "us-central1", "--json"], capsys)
    rows = json.loads(out)
    assert rows and all(r["capacity"] == "spot" and r["vcpus"] >= 4 and r["region"] == "us-central1" for r in rows)


@pytest.mark.parametrize("gpu", ["A100:zero", "A100:0", ":4", "Z9000"],
                         ids=["non-numeric count", "zero count", "no model", "unknown model"])
def test_catalog_offers_bad_gpu_is_exit_2(capsys: pytest.CaptureFixture[str], gpu: str) -> None:
    code, _, err = run(["catalog", "offers", "--gpu", gpu], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--gpu" in err


def test_catalog_info_lists_every_source(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["catalog", "info", "--json"], capsys)
    assert code == 0
    doc = json.loads(out)
    assert {s["provider"] for s in doc["sources"]} == {"aws", "azure", "gcp"}
    assert all({"outliers", "duplicates", "dropped", "date", "source", "regions"} <= set(s) for s in doc["sources"])
    code, out, _ = run(["catalog", "info"], capsys)
    assert code == 0 and "duplicates" in out


@pytest.mark.slow
def test_every_example_places_on_the_shared_catalogs(capsys: pytest.CaptureFixture[str]) -> None:
    if not (SKY_V8 / "gcp" / "vms.csv").is_file():
        pytest.skip("../shared/catalogs/skypilot/v8 is not present on this machine")
    files = sorted(EXAMPLES.glob("*.yaml"))
    assert len(files) >= 6
    placed = {}
    for f in files:
        code, out, err = run(["place", str(f), "--json", "--catalog", str(SKY_V8)], capsys)
        assert code == 0, (f, err)
        for line in out.splitlines():
            d = json.loads(line)
            placed[d["job"]] = d["placement"]
    assert placed["onprem-local"]["provider"] == "onprem"
    assert (placed["data-gravity"]["provider"], placed["data-gravity"]["region"]) == ("aws", "eu-west-1")
    assert placed["train-a100"]["gpus"] >= 8 and placed["train-a100"]["accelerator"] == "A100"
    assert placed["infer-t4-spot"]["capacity"] == "spot" and placed["infer-t4-spot"]["accelerator"] == "T4"
    assert placed["etl-eu-only"]["region"] in ("eu-west-1", "eu-central-1", "europe-west4", "westeurope")


def _option(provider: str, hourly: float, compute: float, egress: float = 0.0, finish: float = 1.0) -> PlacementOption:
    return PlacementOption(provider=provider, region="r1", zone=None, instance_type="t", capacity="on-demand",
                           vcpus=4, memory_gib=16, gpus=0, accelerator=None, hourly_usd=hourly, compute_usd=compute,
                           egress_usd=egress, transfer_hours=0.0, total_usd=compute + egress, finish_hours=finish)


def test_the_explanation_says_the_runner_up_costs_more_not_the_winner() -> None:
    from broker.model import PlacementResult
    from policies.placement.explain import explain

    res = PlacementResult("j", _option("gcp", 1.0, 3.0), (_option("aws", 11.5, 34.49),), considered=2, feasible=2)
    text = explain(res)
    assert "$31.49 less than the runner-up aws:r1" in text
    assert "because the runner-up's compute costs $31.49 more ($11.5000/h against $1.0000/h)" in text
    assert "its compute" not in text
    egress = PlacementResult("j", _option("gcp", 1.0, 3.0), (_option("aws", 1.0, 3.0, egress=5.0),), considered=2)
    assert "because moving the data to the runner-up costs $5.00 more in egress" in explain(egress)


def test_a_tie_is_called_a_tie_not_zero_dollars_less() -> None:
    from broker.model import PlacementResult
    from policies.placement.explain import explain

    res = PlacementResult("j", _option("gcp", 1.0, 3.0, finish=1.0), (_option("aws", 1.0, 3.0, finish=2.0),),
                          considered=2, feasible=2)
    text = explain(res)
    assert "$0.00 less" not in text
    assert "a tie: the runner-up aws:r1 t (on-demand) costs the same ($3.00)" in text
    assert "this one finishes in 1.00 h, the runner-up in 2.00 h" in text
