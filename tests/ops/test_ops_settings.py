"""The fleet-operations keys are read by ``broker.config`` like every other key: defaults, values that reach
the ops service, and a malformed value refused at start naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.config import load_settings
from broker.errors import SpecError
from tests.broker.service_support import make_app


def test_defaults_and_values_reach_the_ops_service(tmp_path: Path) -> None:
    s = load_settings({"BROKER_DATA_DIR": str(tmp_path)})
    assert (s.ops_sample_seconds, s.alert_eval_seconds, s.heartbeat_timeout_seconds) == (60.0, 60.0, 60.0)
    assert s.device_lost_after_seconds is None and s.alert_webhook_url is None
    s = load_settings({"BROKER_DATA_DIR": str(tmp_path), "BROKER_ALERT_EVAL_SECONDS": "15",
                       "BROKER_HEARTBEAT_TIMEOUT_SECONDS": "5", "BROKER_DEVICE_LOST_AFTER_SECONDS": "120"})
    app = make_app(tmp_path, f"sqlite:///{tmp_path / 'o.db'}", alert_eval_seconds=s.alert_eval_seconds,
                   heartbeat_timeout_seconds=s.heartbeat_timeout_seconds,
                   device_lost_after_seconds=s.device_lost_after_seconds)
    ops = app.state.hb.ops
    assert ops.alert_interval_seconds == 15.0
    assert ops.health.heartbeat_timeout_seconds == 5.0 and ops.health.device_timeout_seconds == 120.0


@pytest.mark.parametrize(("env", "key"), [
    ({"BROKER_OPS_SAMPLE_SECONDS": "soon"}, "BROKER_OPS_SAMPLE_SECONDS"),
    ({"BROKER_HEARTBEAT_TIMEOUT_SECONDS": "-1"}, "BROKER_HEARTBEAT_TIMEOUT_SECONDS"),
    ({"BROKER_ALERT_WEBHOOK_URL": "http://127.0.0.1:9/hook"}, "BROKER_ALERT_WEBHOOK_URL"),
], ids=["not a number", "negative", "webhook without its secret"])
def test_a_malformed_ops_key_is_refused_naming_it(tmp_path: Path, env: dict[str, str], key: str) -> None:
    with pytest.raises(SpecError) as exc:
        load_settings({"BROKER_DATA_DIR": str(tmp_path), **env})
    assert exc.value.field == key
