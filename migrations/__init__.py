"""Alembic revisions of outbox-inbox (installed as the package ``outbox_migrations``).

Inside your own Alembic environment add ``outbox_migrations:versions`` to ``version_locations``
and run ``alembic upgrade heads``; standalone, run ``outbox migrate upgrade``.
"""
