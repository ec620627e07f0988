"""Runs: creation, views, cancel, the budget ledger, export and import."""
