"""API keys: their rows (store), who a request acts for (guard), per-key rates (ledger)."""
