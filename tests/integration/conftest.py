"""The integration suite's fixtures (see fixtures.py)."""
from fixtures import client, server, tenant  # noqa: F401
