"""Shared fixtures. Expensive ones are session-scoped: TF import and one tiny training run per session."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("HF_HUB_DISABLE_XET", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

try:  # the loopback Hub (tests/hub_fixtures.py)
    from hub_fixtures import *  # noqa: F401,F403
except ImportError:  # pragma: no cover - while it is being written
    pass
