"""Submitting a step: small rules applied in order to one ``Submission``.

Each rule reads what the rules before it resolved and either goes on (returns ``None``),
answers (returns ``Submitted``: a repeated request, a replay step served from its record),
or refuses by raising a domain error that the HTTP layer maps (422, 403, 409, 429, 503...).
The rules never ask which kind of step they hold: they call the kind's protocol
(``steps/kinds``). In order (``pipeline.RULES``):

    LoadRun -> ResolveKind -> Place -> Police -> BoundPrompt -> MatchRecord -> Quote -> StartNow
    -> Admit -> Insert

Where each lives:

- ``context.py``: the submission the rules resolve (``Submission``), what they answer
  (``Submitted``), the service they run in (``SubmitContext``, ``Starter``), the step they
  build (``build_step``);
- ``rules.py``: the rules up to ``Admit``;
- ``insert.py``: ``Insert``, the last rule, and the general way of storing a step;
- ``fast_path.py``: the one statement that stores a step on PostgreSQL, and what it says
  when it stores nothing; ``statements.py``: the statements, built once;
- ``pipeline.py``: ``RULES`` and ``submit_step``, from a kept run or a read.

The package gives what its callers use (``submit_step`` and its ``SubmitContext``, the
``Submitted`` it answers, ``RULES``, ``Insert``); each rule and the rest are imported from the
module that defines them.

A step's budget rule is ``orchestrator_core/budgets.py`` (``StepBudget``, ``fits``); the
database re-checks it as it reserves (``runs/ledger.RESERVE``).

On PostgreSQL a run the process has read before is taken as it kept it (``runs/kept.py``),
with no read: its settings never change, and what does (its status, its budget, whether the
client_token was used) is checked by the one statement that stores the step. Anything that
statement or a rule finds only a fresh read can decide (a refusal, the token taken, a run
near its budget, a step that must wait) starts the submission again from a read
(``ReadAgain``): only a step stored from the kept run answers from it.

In a replay run ``Place`` takes the run's row lock and matches the recorded step at the
step's position; ``MatchRecord`` serves a step no engine runs again from the record (or
ends it with ``REPLAY_MISS``) without price or admission. In a record run an engine step
whose pool has a free slot, with nothing queued ahead of it there, takes the slot and is
inserted running (``StartNow``): its execution begins once the submission commits, with no
claim of its own; it never waits, so admission (which bounds the queue) does not count it.
"""

from orchestratord.steps.submission.context import SubmitContext, Submitted
from orchestratord.steps.submission.insert import Insert
from orchestratord.steps.submission.pipeline import RULES, submit_step

__all__ = ["RULES", "Insert", "SubmitContext", "Submitted", "submit_step"]
