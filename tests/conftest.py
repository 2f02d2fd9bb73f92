"""Shared fixtures: the plugin loaded through SGLang's own loader, once per session."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def plugin_loaded():
    """SGLang's ``load_plugins()`` has run with the moss_vl plugin (hooks applied)."""
    os.environ.setdefault("SGLANG_PLUGINS", "moss_vl")
    from sglang.srt.plugins import load_plugins

    load_plugins()
    return True
