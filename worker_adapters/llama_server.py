"""llama-cpp-python's own OpenAI-compatible server, its model opened in the plain CPU layout
(``worker_adapters.llama.plain_cpu_layout``: on CPUs with AMX the library's default layout
crashes at the first token). Same arguments as ``python -m llama_cpp.server``; what the
``llama_cpp_server`` provisioner starts.

    python -m worker_adapters.llama_server --model FILE --port 8001
"""

from __future__ import annotations

import runpy

from worker_adapters.llama import plain_cpu_layout


def main() -> None:
    with plain_cpu_layout():
        runpy.run_module("llama_cpp.server", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
