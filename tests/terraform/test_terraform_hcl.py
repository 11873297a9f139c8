"""terraform/ parses, is formatted, documents every input and output, and matches docs/CONFIG.md."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.terraform.tfload import REPO, TERRAFORM, blocks, config_keys, load, module_dirs, tf_files

BROKER_MODULES = [TERRAFORM / "modules" / "broker-aws", TERRAFORM / "modules" / "broker-azure"]
EXAMPLES = [TERRAFORM / "examples" / "aws-complete", TERRAFORM / "examples" / "azure-complete"]
HCL_SRC = Path("/usr/share/gocode/src/github.com/hashicorp/hcl/v2/cmd/hclfmt")


def _rel(p: Path) -> str:
    return p.relative_to(REPO).as_posix()


def test_tree_has_the_modules_and_examples() -> None:
    names = {_rel(d) for d in module_dirs()}
    for want in ["broker-aws", "broker-azure", "provider-identity-aws", "provider-identity-azure",
                 "provider-identity-gcp"]:
        assert f"terraform/modules/{want}" in names
    assert {_rel(e) for e in EXAMPLES} <= names


@pytest.mark.parametrize("path", tf_files(), ids=_rel)
def test_every_tf_file_parses(path: Path) -> None:
    assert isinstance(load(path), dict)


@pytest.fixture(scope="session")
def hclfmt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """hclfmt (hclwrite, the formatter of `terraform fmt`) built from Debian's Go HCL sources."""
    go = shutil.which("go")
    if go is None or not HCL_SRC.is_dir():
        pytest.skip("go or golang-github-hashicorp-hcl-v2-dev is not installed (apt-get install -y golang-go "
                    "golang-github-hashicorp-hcl-v2-dev)")
    out = tmp_path_factory.mktemp("hclfmt") / "hclfmt"
    env = {**os.environ, "GO111MODULE": "off", "GOPATH": "/usr/share/gocode", "GOPROXY": "off",
           "GOCACHE": str(tmp_path_factory.mktemp("gocache")), "GOFLAGS": ""}
    subprocess.run([go, "build", "-o", str(out), "github.com/hashicorp/hcl/v2/cmd/hclfmt"], env=env,
                   check=True, capture_output=True, timeout=240)
    return out


@pytest.mark.slow
def test_every_tf_file_is_formatted(hclfmt: Path) -> None:
    proc = subprocess.run([str(hclfmt), "-check", "-require-no-change", *map(str, tf_files())],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"{proc.stderr.strip()} To fix: run hclfmt -w (or terraform fmt) on them."


@pytest.mark.slow
def test_hclfmt_rejects_bad_formatting(hclfmt: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.tf"
    bad.write_text('variable "x" {\n  type = string\n  default="a"\n}\n')
    proc = subprocess.run([str(hclfmt), "-check", "-require-no-change", str(bad)], capture_output=True, text=True)
    assert proc.returncode != 0


@pytest.mark.parametrize("directory", module_dirs(), ids=_rel)
def test_every_variable_and_output_is_documented(directory: Path) -> None:
    for name, body in blocks(directory, "variable"):
        assert body.get("description"), f"{_rel(directory)}: variable {name} has no description"
        assert "type" in body, f"{_rel(directory)}: variable {name} has no type"
    for name, body in blocks(directory, "output"):
        assert body.get("description"), f"{_rel(directory)}: output {name} has no description"


def _locals(directory: Path) -> dict[str, Any]:
    return dict(blocks(directory, "locals"))


REQUIRED_KEYS = {
    "BROKER_HOST", "BROKER_PORT", "BROKER_DATA_DIR", "BROKER_DATABASE_URL", "BROKER_ADMIN_TOKEN",
    "BROKER_PROVIDERS", "BROKER_LOG_LEVEL", "BROKER_MQTT_URL", "BROKER_MQTT_CA_FILE", "BROKER_MQTT_CERT_FILE",
    "BROKER_MQTT_KEY_FILE", "BROKER_CA_KEY_FILE",
}


@pytest.mark.parametrize("directory", BROKER_MODULES, ids=_rel)
def test_container_environment_uses_only_documented_keys(directory: Path) -> None:
    documented = config_keys()
    loc = _locals(directory)
    env = set(loc["broker_environment_base"]) | set(loc["broker_environment_optional"]) | set(loc["broker_secrets"])
    assert env - set(documented) == set(), "keys not in docs/CONFIG.md"
    assert REQUIRED_KEYS <= env, f"missing {sorted(REQUIRED_KEYS - env)}"
    assert set(loc["broker_secrets"]) == {"BROKER_DATABASE_URL", "BROKER_ADMIN_TOKEN"}, "secrets must not be plain"
    # Every documented server key is set or settable: the rest are optional variables.
    assert set(documented) - env == set()


def _literal_default(doc: str) -> str | None:
    return None if re.search(r"<|unset|generated|~", doc) else doc


@pytest.mark.parametrize("directory", [*BROKER_MODULES, *EXAMPLES], ids=_rel)
def test_broker_key_variables_match_documented_defaults(directory: Path) -> None:
    documented = config_keys()
    for name, body in blocks(directory, "variable"):
        if not name.startswith("broker_"):
            continue
        key = name.upper()
        assert key in documented, f"{_rel(directory)}: variable {name} names no key of docs/CONFIG.md"
        want = _literal_default(documented[key])
        if want is not None:
            assert str(body.get("default")) == want, f"{name}: default {body.get('default')!r} != {want!r}"
        else:
            assert body.get("default") is None


@pytest.mark.parametrize("directory", [*BROKER_MODULES, *EXAMPLES], ids=_rel)
def test_outputs_give_what_clients_and_enroll_need(directory: Path) -> None:
    outputs = dict(blocks(directory, "output"))
    assert {"api_url", "mqtt_url", "ca_bundle_pem"} <= set(outputs)
    assert "mqtts://" in str(dict(_locals(directory)).get("mqtt_url", "mqtts://")) or directory in EXAMPLES


def test_aws_security_groups_open_only_443_and_8883_from_cidrs() -> None:
    rules = {n: b for n, b in blocks(BROKER_MODULES[0], "resource") if n.startswith("aws_security_group_rule.")}
    open_in = {(r["from_port"], r["to_port"], r["cidr_blocks"]) for r in rules.values()
               if r["type"] == "ingress" and "cidr_blocks" in r}
    assert open_in == {(443, 443, "${var.allowed_api_cidrs}"), (8883, 8883, "${var.device_cidrs}")}
    for name, r in rules.items():
        assert r.get("description"), f"{name} has no description"


def test_aws_database_and_mqtt_host_are_hardened() -> None:
    res = dict(blocks(BROKER_MODULES[0], "resource"))
    db = res["aws_db_instance.broker"]
    assert db["storage_encrypted"] is True and db["publicly_accessible"] is False
    assert db["deletion_protection"] == "${var.db_deletion_protection}"
    assert db["backup_retention_period"] == "${var.db_backup_retention_days}"
    vm = res["aws_instance.mqtt"]
    assert vm["metadata_options"][0]["http_tokens"] == "required"
    assert vm["root_block_device"][0]["encrypted"] is True
    for name in ("api", "mqtt"):
        group = res[f"aws_cloudwatch_log_group.{name}"]
        assert group["kms_key_id"] and group["retention_in_days"] == "${var.log_retention_days}"


@pytest.mark.parametrize("template", sorted(TERRAFORM.rglob("*.tftpl")), ids=_rel)
def test_mosquitto_config_requires_client_certificates(template: Path) -> None:
    import json

    from edge.mqttconf import dynsec_document

    text = template.read_text()
    for line in ["listener 8883", "require_certificate true", "use_identity_as_username true",
                 "allow_anonymous false", "plugin /usr/lib/mosquitto_dynamic_security.so",
                 "plugin_opt_config_file /var/lib/mosquitto/dynsec.json"]:
        assert line in text
    assert "listener 1883" not in text and "acl_file" not in text
    # the plugin's initial state is exactly what `broker mqtt config` writes (devices are added by the gateway)
    doc = text.split("<<'DYNSEC'\n", 1)[1].split("\nDYNSEC\n", 1)[0]
    assert json.loads(doc.replace("${gateway_common_name}", "hb-gateway")) == dynsec_document("hb-gateway")
