"""Tools as the domain sees them: argument checking against a tool's JSON Schema."""

from orchestrator_core.tools.args import ArgError, arg_errors, check_args

__all__ = ["ArgError", "arg_errors", "check_args"]
