"""Repository functions: one per use case, each taking a transaction and keyword ids."""
