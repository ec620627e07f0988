"""Flows: content-addressed agent programs (routes and service)."""
