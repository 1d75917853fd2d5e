"""${message}

Revision ID: ${up_revision}
Revises: ${down_revision | comma,n}
Create Date: ${create_date}
"""

from __future__ import annotations

from alembic import op

from outbox._migrate import configured_schema

revision = ${repr(up_revision)}
down_revision = ${repr(down_revision)}
branch_labels = ${repr(branch_labels)}
depends_on = ${repr(depends_on)}


def upgrade() -> None:
    schema = configured_schema(op.get_context().config)
    ${upgrades if upgrades else "pass"}


def downgrade() -> None:
    schema = configured_schema(op.get_context().config)
    ${downgrades if downgrades else "pass"}
