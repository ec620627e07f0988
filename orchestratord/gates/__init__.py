"""Gates at run time: CEL evaluated in processes of their own (``pool``, ``worker``), over
the run's latest facts (``facts``), re-evaluated when those facts change (``watch``).

The rules of an expression (compiling, the static cost estimate, what its value means) are
``orchestrator_core.gates``; the step kind is ``steps/kinds/gate_eval.py``.
"""
