"""Fixtures of the service tests: ``pg_cluster``, a private PostgreSQL cluster tests may stop and restart."""

from tests.broker.pg_cluster import pg_cluster

__all__ = ["pg_cluster"]
