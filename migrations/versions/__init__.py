"""Revisions on the ``outbox`` branch."""
