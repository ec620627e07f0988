"""The client side: a small synchronous client of the v1 API and the ``orchctl`` CLI.

It imports only ``contracts`` and httpx, so it installs and runs without the server."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("orchestratord")
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"
