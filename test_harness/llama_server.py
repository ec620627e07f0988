"""llama-cpp-python's own OpenAI-compatible server, as the ``llama_cpp_server`` provisioner
starts it (``worker_adapters.llama_server``). Same arguments as ``python -m llama_cpp.server``.

    .venv/bin/python -m test_harness.llama_server --model FILE --port 8001
"""

from __future__ import annotations

from worker_adapters.llama_server import main

if __name__ == "__main__":
    main()
