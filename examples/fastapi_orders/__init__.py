"""An order service on FastAPI: see app.py."""
