"""What a new user trips on, through the real ``broker`` entry point (in-process) against a real server: jobs list
without a namespace, spec files that YAML would silently misread, errors naming the file, serve on a busy port,
--json on the admin commands, --version, the help of flags, and the curl examples of docs/POLICIES.md."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from broker.cli import main
from tests.broker.service_support import ADMIN, job_doc, make_app, serve_in_thread


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("cli-newuser")
    with serve_in_thread(make_app(tmp, f"sqlite:///{tmp}/broker.db")) as base:
        yield base


@pytest.fixture
def cli(url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):  # type: ignore[no-untyped-def]
    """``cli(args, token=ADMIN) -> (exit code, stdout, stderr)``."""
    monkeypatch.delenv("BROKER_NAMESPACE", raising=False)
    monkeypatch.setenv("BROKER_URL", url)

    def run(args: list[str], token: str = ADMIN) -> tuple[int, str, str]:
        monkeypatch.setenv("BROKER_TOKEN", token)
        with pytest.raises(SystemExit) as exc:
            main(args)
        out = capsys.readouterr()
        code = exc.value.code
        return (code if isinstance(code, int) else (0 if code is None else 1)), out.out, out.err

    return run


def _spec_file(path: Path, *docs: dict) -> str:  # type: ignore[type-arg]
    path.write_text("---\n".join(yaml.safe_dump(d, sort_keys=False) for d in docs))
    return str(path)


def test_jobs_list_with_the_admin_token_lists_every_namespace_and_an_empty_list_says_where(
    cli, tmp_path: Path  # type: ignore[no-untyped-def]
) -> None:
    assert cli(["namespaces", "create", "team-nu"])[0] == 0
    code, token, _ = cli(["tokens", "create", "-n", "team-nu"])
    token = token.strip()
    code, out, err = cli(["jobs", "list"], token)  # a namespace token, nothing submitted yet
    assert (code, out) == (0, "") and err.strip() == "no jobs in namespace 'team-nu' (pass -n NAMESPACE for another)"

    assert cli(["submit", _spec_file(tmp_path / "a.yaml", job_doc("in-team"))], token)[0] == 0
    assert cli(["submit", "-n", "default", _spec_file(tmp_path / "b.yaml", job_doc("in-default"))])[0] == 0
    code, out, _ = cli(["jobs", "list"])  # the admin token, no -n: every namespace, names qualified
    names = [line.split()[1] for line in out.splitlines()]
    assert code == 0 and "team-nu/in-team" in names and "default/in-default" in names
    code, out, _ = cli(["jobs", "list", "-n", "team-nu"])
    assert [line.split()[1] for line in out.splitlines()] == ["in-team"]
    code, out, err = cli(["jobs", "list", "--state", "RUNNING"])
    assert (code, out) == (0, "") and "no jobs matching the filters in any of the" in err


def test_a_duplicate_key_is_refused_with_its_line(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    spec = tmp_path / "dup.yaml"
    spec.write_text(yaml.safe_dump(job_doc("dup"), sort_keys=False).replace("  command:", "  durationHours: 2\n"
                                                                                           "  command:", 1))
    code, out, err = cli(["submit", str(spec)])
    assert code == 2 and out == ""
    line = next(i for i, t in enumerate(spec.read_text().splitlines(), 1) if "durationHours: 0.01" in t)
    assert err.startswith(f"error: {spec}: duplicate key 'durationHours' at line {line}")
    assert len(err.strip().splitlines()) == 1
    code, _, err = cli(["place", str(spec)])
    assert code == 2 and "duplicate key 'durationHours'" in err


def test_specs_concatenated_without_a_separator_are_refused_not_merged_into_one(
    cli, tmp_path: Path  # type: ignore[no-untyped-def]
) -> None:
    spec = tmp_path / "two.yaml"
    spec.write_text(yaml.safe_dump(job_doc("first"), sort_keys=False) + yaml.safe_dump(job_doc("second"),
                                                                                       sort_keys=False))
    code, out, err = cli(["submit", "-n", "default", str(spec)])
    assert code == 2 and out == ""
    assert "duplicate key 'apiVersion'" in err and "put a line '---' between them" in err
    assert "second" not in cli(["jobs", "list", "-n", "default"])[1]
    code, _, err = cli(["place", str(spec)])
    assert code == 2 and "put a line '---' between them" in err


def test_an_error_in_the_second_of_several_files_names_that_file_and_submits_nothing(
    cli, tmp_path: Path  # type: ignore[no-untyped-def]
) -> None:
    good = _spec_file(tmp_path / "good.yaml", job_doc("good-one"))
    bad = _spec_file(tmp_path / "bad.yaml", job_doc("bad-one", memory="32GB"))
    code, out, err = cli(["submit", "-n", "default", good, bad])
    assert code == 2 and out == ""
    assert err.startswith(f"error: {bad}: spec.resources.requests.memory")
    assert "good-one" not in cli(["jobs", "list", "-n", "default"])[1]


def test_the_admin_commands_answer_json(cli) -> None:  # type: ignore[no-untyped-def]
    assert cli(["namespaces", "create", "team-js"])[0] == 0
    code, out, _ = cli(["namespaces", "list", "--json"])
    assert code == 0 and "team-js" in [n["name"] for n in json.loads(out)]
    code, out, _ = cli(["tokens", "create", "-n", "team-js", "--description", "ci", "--json"])
    created = json.loads(out)
    assert code == 0 and created["namespace"] == "team-js" and created["token"].startswith("hb_")
    code, out, _ = cli(["tokens", "list", "-n", "team-js", "--json"])
    (listed,) = json.loads(out)
    assert code == 0 and listed["id"] == created["id"] and listed["description"] == "ci" and "token" not in listed


def test_serve_on_a_busy_port_fails_before_it_says_serving(
    cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch  # type: ignore[no-untyped-def]
) -> None:
    monkeypatch.setenv("BROKER_DATA_DIR", str(tmp_path / "data"))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, out, err = cli(["serve", "--host", "127.0.0.1", "--port", str(port)])
    assert code == 1 and "serving on" not in err and "Traceback" not in err
    assert err.strip() == (f"error: cannot listen on 127.0.0.1:{port}: Address already in use. To fix: stop what "
                           "listens there or pass another --port (BROKER_PORT)")


def test_version_and_the_help_of_flags(cli, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    from broker import __version__
    from edge.agent.cli import main as agent_main

    assert cli(["--version"])[:2] == (0, f"broker (hybrid-broker) {__version__}\n")
    with pytest.raises(SystemExit) as exc:
        agent_main(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out == f"edge-agent {__version__}\n"
    code, out, _ = cli(["submit", "--help"])
    assert code == 0 and "<bool>" not in out
    wait_row = next(line for line in out.splitlines() if line.lstrip("│ ").startswith("--wait"))
    assert "follow the jobs until they end" in wait_row
    namespace_row = next(line for line in out.splitlines() if line.lstrip("│ ").startswith("--namespace"))
    assert "<str>" in namespace_row  # options that take a value still show its type


def _curl_lines(doc: Path) -> list[str]:
    return [line.split("   #")[0].strip() for line in doc.read_text().splitlines() if line.startswith("curl ")]


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_the_curl_examples_of_the_policies_doc_work_as_written(url: str) -> None:
    lines = _curl_lines(Path(__file__).resolve().parents[2] / "docs" / "POLICIES.md")
    assert any(" -X PUT " in line for line in lines)
    assert httpx.post(f"{url}/v1/namespaces", json={"name": "team-a"},
                      headers={"Authorization": f"Bearer {ADMIN}"}).status_code == 201
    token = httpx.post(f"{url}/v1/namespaces/team-a/tokens", headers={"Authorization": f"Bearer {ADMIN}"},
                       json={}).json()["token"]
    env = {**os.environ, "ADMIN": ADMIN, "TOKEN": token, "BROKER_URL": url}
    for line in lines:
        # the line as documented, plus options that only report the status (no proxy: loopback)
        command = line.replace("curl ", "curl --noproxy '*' -sS -o /dev/null -w '%{http_code}' ", 1)
        done = subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True, timeout=30)
        assert done.stdout == "200", (line, done.stdout, done.stderr)
    queue = httpx.get(f"{url}/v1/namespaces/team-a/queue", headers={"Authorization": f"Bearer {token}"}).json()
    assert queue["discipline"] == "fifo" and queue["weight"] == 2
