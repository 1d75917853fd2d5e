"""Runnable example services using outbox-inbox (tested in tests/integration/test_fastapi.py)."""
