"""Streams: the live hub, SSE encoding and the step and run stream routes."""
