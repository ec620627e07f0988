"""Tool executors: what runs a ``tool_call`` step's tool (an HTTP endpoint, a builtin)."""
