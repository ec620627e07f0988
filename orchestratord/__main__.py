"""``python -m orchestratord`` and the ``orchestratord`` command."""

import gc
import sys


def main() -> int:
    """The CLI, imported with the collector off: importing it builds tens of thousands of
    objects that all live as long as the process (modules, models, compiled statements), and
    the collector's passes over them as they are built free nothing (measured: 10% of the
    import's CPU). ``serve`` collects once and freezes what its start built."""
    gc.disable()
    try:
        from orchestratord.cli import main as run
    finally:
        gc.enable()
    return run()


if __name__ == "__main__":
    sys.exit(main())
