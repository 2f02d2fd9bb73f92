"""Shared fixtures: the plugin loaded through SGLang's own loader, once per session."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
# The load-test fixture server imports its siblings by name (it also runs as a script).
sys.path.insert(0, str(Path(__file__).parent / "loadtest"))


@pytest.fixture(scope="session")
def plugin_loaded():
    """SGLang's ``load_plugins()`` has run with the moss_vl plugin (hooks applied)."""
    os.environ.setdefault("SGLANG_PLUGINS", "moss_vl")
    from sglang.srt.plugins import load_plugins

    load_plugins()
    return True


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    """One tiny MOSS-VL checkpoint (with its modeling file) for the whole session."""
    from moss_vl.testing import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny-moss-vl-model"))


@pytest.fixture(scope="session")
def tiny_engine(tiny_checkpoint):
    """The tiny checkpoint loaded by `moss_vl.infer` on the CPU (transformers, remote code)."""
    from moss_vl.infer import load_engine

    return load_engine(str(tiny_checkpoint), device="cpu", served_model_name="moss-vl")


@pytest.fixture(scope="session")
def model_server(tiny_engine):
    """`moss-vl serve --engine transformers`'s app on 127.0.0.1 (a real model server)."""
    from model_server import ModelServer

    server = ModelServer(tiny_engine).start()
    yield server
    server.stop()


@pytest.fixture
def fixture_server():
    """Start FixtureServers (the SGLang wire stand-in, tests/loadtest/fixture_server.py) on
    127.0.0.1 (free ports); all are stopped at teardown."""
    from fixture_server import FixtureConfig, FixtureServer

    servers: list[FixtureServer] = []

    def start(**config) -> FixtureServer:
        server = FixtureServer(FixtureConfig(**config)).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()
