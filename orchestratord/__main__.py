import sys

from orchestratord.cli import main

sys.exit(main())
