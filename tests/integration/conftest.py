"""The integration suite's fixtures (see fixtures.py)."""
from fixtures import client, engramd, pg, pytest_runtest_makereport, server, tenant  # noqa: F401
