"""The fake OpenAI-compatible engine as a process of its own (what a provisioning command
starts in tests):

    python -m test_harness.fake_openai_server --port 8001
"""

from __future__ import annotations

import argparse

import uvicorn

from test_harness.fake_openai import create_fake_openai


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    uvicorn.run(create_fake_openai(), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
