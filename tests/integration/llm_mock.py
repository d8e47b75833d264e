"""What the suites that drive a chat model share: the scripted model server
(tests/llm/mock_llm.py, run by mockctl.MockLLM: both providers' APIs over real HTTP, faults on
demand) as a module fixture, and the engramd options that point the server at it."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "llm"))
from mockctl import MockLLM  # noqa: E402,F401  (re-exported for the suites)


def mock_fixture(key):
    """A module-scoped fixture: one scripted model server taking the API key `key`."""
    @pytest.fixture(scope="module")
    def mock():
        m = MockLLM(key=key)
        yield m
        m.stop()
    return mock


def llm_args(mock, api, key, timeout_ms=1500, retries=1):
    """engramd's options for a provider of `api` (anthropic or openai) on `mock`, model
    mock-haiku, the key on the command line."""
    return ["--llm-provider", api, "--llm-url", mock.url(api), "--llm-model", "mock-haiku",
            "--llm-api-key", key, "--llm-timeout-ms", str(timeout_ms),
            "--llm-retries", str(retries)]
