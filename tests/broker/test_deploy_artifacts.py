"""What the docs tell a new user to build works as written: the Dockerfile (what it copies and runs), the wheel
it installs (built here, installed apart from the checkout), the README's install commands, and one Mosquitto
queue limit for `broker mqtt config` and the terraform modules."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _dockerfile() -> tuple[str, dict[str, str]]:
    text = (REPO / "Dockerfile").read_text()
    args = dict(re.findall(r"^ARG (\w+)=(\S+)$", text, re.M))
    return text, args


def test_the_dockerfile_copies_what_exists_and_runs_what_terraform_expects() -> None:
    import tomllib

    text, args = _dockerfile()
    sources = [s for line in re.findall(r"^COPY (?!--from)(.+)$", text, re.M) for s in line.split()[:-1]]
    assert sources and all((REPO / s).exists() for s in sources), sources
    packages = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    assert {p.rstrip("*") for p in packages["include"]} <= set(sources)  # every package of the wheel is copied
    ignored = (REPO / ".dockerignore").read_text().split()
    assert not set(sources) & set(ignored)
    cmd = json.loads(re.search(r"^CMD (\[.*\])$", text, re.M).group(1))  # type: ignore[union-attr]
    for module in ("broker-aws", "broker-azure"):
        tf = "\n".join(p.read_text() for p in (REPO / "terraform" / "modules" / module).glob("*.tf"))
        commands = [json.loads(c) for c in re.findall(r'\bcommand\s*=\s*(\[\s*"[^"]*"(?:\s*,\s*"[^"]*")*\s*\])', tf)]
        assert cmd in commands, (module, commands)
    uid = re.search(r'variable "container_uid" \{[^}]*default\s*=\s*(\d+)', (
        REPO / "terraform" / "modules" / "broker-aws" / "variables.tf").read_text())
    assert uid and re.search(rf"^USER {uid.group(1)}$", text, re.M)
    assert "/healthz" in text and text.count("HEALTHCHECK") == 1
    extras = set(args["EXTRAS"].split(","))
    optional = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert "server" in extras and extras <= set(optional)


@pytest.mark.slow
def test_the_wheel_the_image_installs_holds_every_package_file_and_runs_apart_from_the_checkout(
    tmp_path: Path,
) -> None:
    """Built as the Dockerfile builds it: every file of the packages (migrations, catalog data...) is in it, its
    extras include the image's, and installed away from the checkout it is the `broker` that runs."""
    _, args = _dockerfile()
    dist = tmp_path / "dist"
    src = tmp_path / "src"  # build from a copy: the checkout is shared (other test workers read it) and stays clean
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(".venv*", ".git", "build", "dist", "*.egg-info",
                                                             "__pycache__", "*_cache"))
    built = subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(src)],
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = dist.glob("hybrid_broker-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        meta = zf.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        entry_points = zf.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    tracked = subprocess.run(["git", "ls-files", "broker", "providers", "edge", "pricing", "policies"], cwd=REPO,
                             capture_output=True, text=True, check=True).stdout.split()
    assert tracked and set(tracked) - names == set()
    assert set(args["EXTRAS"].split(",")) <= set(re.findall(r"^Provides-Extra: (\S+)$", meta, re.M))
    assert "broker = broker.cli:main" in entry_points
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-compile", "--target",
                    str(site), str(wheel)], check=True, capture_output=True, timeout=300)
    code = "import broker, broker.cli; print(broker.__file__); broker.cli.main(['--version'])"
    ran = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(site)},
                         capture_output=True, text=True, timeout=60)
    where, version = ran.stdout.splitlines()
    assert where.startswith(str(site)) and version == "broker (hybrid-broker) 0.1.0", ran.stderr


def test_broker_mqtt_config_and_the_terraform_mosquitto_agree_on_the_queue_limits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from broker.cli import main

    monkeypatch.setenv("BROKER_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("BROKER_DATABASE_URL", raising=False)
    for args in (["ca", "init", "--local"], ["mqtt", "config", "--out", str(tmp_path / "mqtt")]):
        with pytest.raises(SystemExit) as exc:
            main(args)
        assert exc.value.code in (0, None), capsys.readouterr().err

    def limits(text: str) -> dict[str, str]:
        return dict(re.findall(r"^(max_queued_messages|max_queued_bytes) (\d+)$", text, re.M))

    generated = limits((tmp_path / "mqtt" / "mosquitto.conf").read_text())
    assert set(generated) == {"max_queued_messages", "max_queued_bytes"}
    templates = list((REPO / "terraform" / "modules").glob("*/templates/mosquitto-*.tftpl"))
    assert len(templates) == 2
    for template in templates:
        assert limits(template.read_text()) == generated, template.name


def test_the_readme_install_commands_name_files_that_exist() -> None:
    """The README's install block: the extras it names exist, the wheel name is the one `build` makes."""
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    readme = (REPO / "README.md").read_text()
    block = readme.split("## Installing", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    wheel = f"dist/{project['name'].replace('-', '_')}-{project['version']}-py3-none-any.whl"
    for line in block.splitlines():
        words = shlex.split(line, comments=True)
        for word in words:
            if "[" in word and word.endswith("]"):
                target, extras = word[:-1].split("[")
                assert target in (".", wheel), line
                assert set(extras.split(",")) <= set(project["optional-dependencies"]), line
    assert "pip install 'hybrid-broker[" not in readme
