"""orchestratord: the HTTP/SSE control plane (app, persistence, dispatcher, CLI)."""

__version__ = "0.1.0"
