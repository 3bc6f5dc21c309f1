"""Child process of `LocalModel`: llama.cpp's HTTP server (xllamacpp) until SIGTERM.

``python -m services.devtools.local_model_server --model F.gguf --port N [--n-ctx N]
[--threads N] --alias NAME`` (n_ctx and threads default to `LocalModelConfig`'s). Run it
with ``OMP_WAIT_POLICY=PASSIVE`` in the environment (`LocalModel` does): with OpenMP's
default busy-waiting, decoding slowed from 18.7 to 3.4 tokens/s here whenever another
process was busy.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Any

from services.devtools.local_model import LocalModelConfig


def params(args: argparse.Namespace) -> Any:
    """`xllamacpp.CommonParams` for one slot on 127.0.0.1 with the prompt cache on."""
    import xllamacpp  # the pinned wheel; installed by LocalModel before this runs

    p = xllamacpp.CommonParams()
    p.model.path = args.model
    p.model_alias = {args.alias}
    p.hostnames = ["127.0.0.1"]
    p.port = args.port
    p.n_ctx = args.n_ctx
    # One slot: a request may use the whole context, and consecutive requests of one tool
    # loop land in the slot that holds their common prefix (cache_prompt reuses it).
    p.n_parallel = 1
    p.cache_prompt = True
    p.cache_ram_mib = args.cache_ram_mib  # host-RAM copies of earlier prompts' KV state
    p.offline = True  # never fetch anything (models, templates)
    p.use_jinja = True  # the GGUF's own chat template
    p.cpuparams.n_threads = args.threads
    p.cpuparams_batch.n_threads = args.threads
    p.endpoint_metrics = True
    p.endpoint_slots = True
    return p


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="local_model_server", description=__doc__)
    parser.add_argument("--model", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--n-ctx", type=int, default=LocalModelConfig.n_ctx)
    parser.add_argument("--threads", type=int, default=LocalModelConfig.threads)
    parser.add_argument("--alias", required=True)
    parser.add_argument("--cache-ram-mib", type=int, default=1024)
    args = parser.parse_args(argv)

    import xllamacpp

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    server = xllamacpp.Server(params(args))  # loads the model and starts the HTTP server
    print(f"local model server: listening on 127.0.0.1:{args.port}", flush=True)
    while not stop.wait(1.0):
        pass
    del server
    return 0


if __name__ == "__main__":
    sys.exit(main())
