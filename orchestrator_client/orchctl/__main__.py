"""``python -m orchestrator_client.orchctl``: the same as the ``orchctl`` console script."""

import sys

from orchestrator_client.orchctl.cli import main

sys.exit(main())
