"""Domain rules of orchestratord: lifecycles, hashing, placement, event order.

Nothing here knows HTTP or SQL; errors are raised from :mod:`orchestrator_core.errors`.
"""
