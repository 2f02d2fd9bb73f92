"""GPU tests run only where CUDA and FlashInfer are present (the H200; see README.md)."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except Exception:  # torch without CUDA support, or broken driver
        has_cuda = False
    reason = None
    if not has_cuda:
        reason = "needs a CUDA device: run on the H200 as tests/gpu/README.md says"
    else:
        try:
            import flashinfer  # noqa: F401
        except Exception as exc:
            reason = f"needs FlashInfer (carry .whl as tests/gpu/README.md says): {exc}"
    for item in items:
        if "tests/gpu/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.gpu)
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))
