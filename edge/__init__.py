"""hybrid-broker edge: the agent and its wire protocol; installs without the broker's server deps.

Modules: :mod:`edge.pki` (CA, enrollment tokens, CSRs, CRLs), :mod:`edge.protocol` (topics, signed
envelope, receipt checks), :mod:`edge.mqttconf` (Mosquitto configuration), :mod:`edge.agent`."""

__all__ = ["pki", "protocol", "mqttconf", "agent"]
