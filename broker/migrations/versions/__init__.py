"""Alembic revisions (one module per revision; Alembic itself ignores this file)."""
