"""The node pool's helper process (Go: tensor/nodepool; docs/ray.md,
"Memory like Ray's").

A Ray worker's runtime (slab mode) asks its node's helper for populated
memory whenever it needs a new slab, so a cold state dict's copy pays no
page population; when no helper answers, the runtime starts one with
``python -m tensorlane._nodepool --socket PATH --budget BYTES`` (the
config's ``node_pool_helper``, filled in by :func:`helper_command`). This
module is that command: it detaches (a new session, the launcher returns
at once, so the runtime that started it reaps it) and serves until no
runtime of the node has been connected for TENSORLANE_NODE_POOL_IDLE_S
seconds (default 10), then ends. A second helper for the same socket ends
at once.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import List

#: Seconds the helper outlives its last runtime (default 10).
ENV_IDLE = "TENSORLANE_NODE_POOL_IDLE_S"
#: A file for the helper's log (warnings; with TENSORLANE_NODE_POOL_DEBUG=1
#: every take, miss and refill). Default: none.
ENV_LOG = "TENSORLANE_NODE_POOL_LOG"


def helper_command() -> List[str]:
    """The ``node_pool_helper`` a Python runtime gives the C ABI."""
    return [sys.executable, "-m", "tensorlane._nodepool"]


def main(argv: List[str]) -> int:
    p = argparse.ArgumentParser(prog="tensorlane._nodepool")
    p.add_argument("--socket", required=True)
    p.add_argument("--budget", type=int, default=0)
    p.add_argument("--foreground", action="store_true", help="do not detach")
    a = p.parse_args(argv)
    idle_ms = int(float(os.environ.get(ENV_IDLE) or 0) * 1000)
    if not a.foreground:
        # Detach before the Go runtime loads (it does not survive fork):
        # the launcher exits now, and the helper belongs to no actor's
        # process group or session, so it lives until its own idle end.
        if os.fork() > 0:
            os._exit(0)
        os.setsid()
    log = os.environ.get(ENV_LOG)
    if log:  # the helper's log (TENSORLANE_NODE_POOL_DEBUG=1: every take and refill)
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(fd, 2)
        os.close(fd)
    from . import _lib

    lib = _lib.lib()
    _lib.check(lib.tl_node_pool_serve(a.socket.encode(), a.budget, idle_ms))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
