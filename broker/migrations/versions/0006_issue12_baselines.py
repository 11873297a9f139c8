"""Decision records keep what the report's savings baselines need, priced at decision time (issue 12).

Revision ID: 0006_issue12_baselines
Revises: 0006_issue17_leader (chained at merge)
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006_issue12_baselines"
down_revision = "0006_issue17_leader"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add ``decision_records.baselines`` as ``broker.decisions.DecisionRecord`` declares it (nullable JSON:
    records written before this revision have none)."""
    with op.batch_alter_table("decision_records") as batch:
        batch.add_column(sa.Column("baselines", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("decision_records") as batch:
        batch.drop_column("baselines")
