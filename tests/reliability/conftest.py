"""The reliability suite shares the integration tests' harness (tests/integration)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))

from fixtures import (client, engramd, pg, pytest_runtest_makereport, server,  # noqa: E402,F401
                      tenant)
