"""orchctl: the command-line client of an orchestratord server, one command per noun and verb.

  flows        create FILE | get FLOW_ID
  runs         create | list | get | watch | complete | cancel | fork
               | replay | report | export | import
  steps        submit | list | get | cancel | stream
  facts        add | list
  checkpoints  create | list
  pools        list | get | drain | undrain | create | provision | delete
  replay, report, export, import: the same as ``runs replay`` ... (scripts call them so)

Every command takes ``--json`` (the model's JSON and nothing else on stdout; a failure
prints ``{"error": <body>}``) and ``--url``/``--timeout`` before or after the command; the
server is ``$ORCHCTL_URL`` and its key ``$ORCHCTL_API_KEY`` when not given. Tables are drawn
with rich, in colour only on a terminal and without ``$NO_COLOR``.

Exit status:

- 0: done; a followed step or a watched run succeeded; a replay is identical.
- 1: what was asked about failed: a followed step (``steps stream``, ``steps submit
  --follow``) ended in error or was cancelled, a watched run failed or was cancelled, a
  replay diverged, missed or failed.
- 2: usage error, an error the server answered (its code and message on stderr), or the
  server could not be reached.
- 130: interrupted (Ctrl-C). 141: stdout was closed early (``orchctl ... | head``).

``docs/orchctl.md`` shows each command.
"""

from __future__ import annotations

from orchestrator_client.orchctl.cli import build_parser, main

__all__ = ["build_parser", "main"]
