"""Facts (append-only, typed) and checkpoints of a run."""
