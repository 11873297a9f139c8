"""The edge agent: durable SQLite outbox/inbox, executor, MQTT transport, enrollment, CLI.

Imports only the stdlib, pyyaml, paho-mqtt and cryptography (``pip install 'hybrid-broker[edge]'``).
Submodules are imported on use so that ``edge-agent --help`` stays cheap."""

__all__ = ["store", "executor", "transport", "runtime", "config", "enroll", "install", "sysinfo", "cli"]
