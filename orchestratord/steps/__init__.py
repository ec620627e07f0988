"""Everything that happens to a step: its routes, submission rules, the one status writer,
the runner, and one module per step kind (``kinds/``)."""
