#!/usr/bin/env python
"""Record what the "GPU Memory" sidebar receives while a small model trains.

Run in a Python process with torch and jupyter_gpumem installed (on a GPU
machine for the README's picture)::

    python scripts/record_stream.py --out docs/sidebar-stream.json

It starts an in-process IPython shell, loads the extension there
(``%load_ext jupyter_gpumem``, as a user would), and opens a comm on the
product's comm target ``jupyter_gpumem`` the way the sidebar does (only the
transport is a recording comm, as in tests/views/test_comm.py): the kernel side
answers ``hello``, then sends ``devices`` about once a second and a
``snapshot`` after each cell. It runs a few cells that train a small model
on the device and leave some holders behind (the model, its optimizer, a
``loss`` that keeps its graph, a displayed tensor in ``Out``, a tensor shared
by two names), and writes every message the sidebar would receive, with the
seconds since the comm opened, to a JSON file. The browser test
tests/e2e/test_sidebar.py replays that file into the sidebar.

``--device cpu`` records the same cells on the host (for a machine without
a GPU; smaller sizes), which is how the test suite proves the script works.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import platform
import sys
import threading
import time
import uuid
from pathlib import Path

TARGET = "jupyter_gpumem"  # the comm target the sidebar opens (docs/PROTOCOL.md)
STREAM_SCHEMA = "jupyter_gpumem.stream/1"

# (cell source, seconds to wait after it for device readings); {dev} and the
# sizes are filled in per device.
CELLS = [
    ("import torch\nfrom torch import nn\ndev = {dev!r}", 1.0),
    ("model = nn.Sequential(nn.Linear({width}, 4 * {width}), nn.ReLU(),\n"
     "                      nn.Linear(4 * {width}, {width})).to(dev)\n"
     "opt = torch.optim.Adam(model.parameters(), lr=1e-3)", 1.5),
    ("for step in range({steps}):\n"
     "    x = torch.randn({batch}, {width}, device=dev)\n"
     "    loss = model(x).square().mean()\n"
     "    opt.zero_grad()\n"
     "    loss.backward()\n"
     "    opt.step()\n"
     "loss.item()", 1.5),
    # a loss kept with its graph (the hint says: store loss.item())
    ("x = torch.randn(4 * {batch}, {width}, device=dev)\nloss = model(x).square().mean()", 1.5),
    # a GPU value shown as the cell's result stays in Out (the hint says: end with ;)
    ("big = torch.ones({big_rows}, 1024, 1024, device=dev)\nbig[:2]", 1.5),
    ("small2 = torch.zeros({small_rows}, 1024, device=dev)\nalias = small2", 2.5),
]

SIZES = {
    # about 0.5 GiB of weights (1.5 GiB with Adam's state), 1 GiB in big
    "cuda": {"width": 4096, "batch": 512, "steps": 60, "big_rows": 256, "small_rows": 16384},
    # a few MiB: quick on any CPU
    "cpu": {"width": 256, "batch": 64, "steps": 20, "big_rows": 4, "small_rows": 512},
}


def _recording_comm_class():
    from comm.base_comm import BaseComm

    class RecordingComm(BaseComm):
        """A comm whose messages are kept instead of sent to a frontend."""

        def __init__(self, started: float, **kwargs):
            self.started = started
            self.sent: list[dict] = []
            self.lock = threading.Lock()
            super().__init__(**kwargs)

        def publish_msg(self, msg_type, data=None, metadata=None, buffers=None, **keys):
            if msg_type != "comm_msg":
                return
            data = json.loads(json.dumps(data))  # what the kernel sends must be JSON
            with self.lock:
                self.sent.append({"t": round(time.monotonic() - self.started, 3), "data": data})

    return RecordingComm


def _open_sidebar(started: float):
    """Open a comm on the product's target as ipykernel's CommManager does for a frontend."""
    import comm as comm_pkg

    manager = comm_pkg.get_comm_manager()
    if TARGET not in manager.targets:
        raise SystemExit(f"no comm target {TARGET!r}: %load_ext jupyter_gpumem did not register it")
    comm_id = uuid.uuid4().hex
    c = _recording_comm_class()(started, comm_id=comm_id, primary=False, target_name=TARGET)
    manager.register_comm(c)
    manager.targets[TARGET](
        c, {"content": {"comm_id": comm_id, "target_name": TARGET, "data": {}}}
    )
    return c


def _request(c, data: dict) -> None:
    """Deliver one request from the sidebar to the kernel side."""
    c.handle_msg({"content": {"comm_id": c.comm_id, "data": data}})


def _device_names(dev: str) -> list[str]:
    import torch

    if dev.startswith("cuda") and torch.cuda.is_available():
        return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return []


def record(device: str, sidebar_device: str, pause: float) -> dict:
    import torch
    from IPython.core.interactiveshell import InteractiveShell

    import jupyter_gpumem

    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("torch sees no CUDA device here: run on a GPU machine, or pass --device cpu")
    sizes = SIZES["cuda" if device.startswith("cuda") else "cpu"]
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "jupyter_gpumem")
    started = time.monotonic()
    wall_start = time.time()
    c = _open_sidebar(started)
    # what the sidebar does after hello: ask for its device selection
    _request(c, {"type": "set_device", "id": 1, "device": sidebar_device})
    time.sleep(pause)
    cells = []
    for source, wait in CELLS:
        code = source.format(dev=device, **sizes)
        t = round(time.monotonic() - started, 3)
        with contextlib.redirect_stdout(io.StringIO()):  # the cells' shown values
            result = ip.run_cell(code, store_history=True)
        if not result.success:
            raise SystemExit(f"cell failed: {code!r}: {result.error_in_exec or result.error_before_exec}")
        cells.append({"t": t, "t_end": round(time.monotonic() - started, 3), "source": code})
        time.sleep(wait * pause)
    # what the sidebar's refresh button does
    _request(c, {"type": "refresh", "id": 2})
    time.sleep(pause)
    with c.lock:
        messages = list(c.sent)
    ip.run_line_magic("unload_ext", "jupyter_gpumem")
    kinds: dict[str, int] = {}
    for m in messages:
        kinds[m["data"].get("type", "?")] = kinds.get(m["data"].get("type", "?"), 0) + 1
    return {
        "schema": STREAM_SCHEMA,
        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(wall_start)),
        "started": wall_start,
        "device": device,
        "sidebar_device": sidebar_device,
        "gpus": _device_names(device),
        "versions": {
            "jupyter_gpumem": getattr(jupyter_gpumem, "__version__", None),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "python": platform.python_version(),
        },
        "cells": cells,
        "counts": kinds,
        "messages": messages,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="docs/sidebar-stream.json",
                        help="JSON file to write (default: %(default)s)")
    parser.add_argument("--device", default=None,
                        help="where the cells train: cuda, cuda:N or cpu "
                             "(default: cuda when torch sees one, else an error)")
    parser.add_argument("--sidebar-device", default=None,
                        help="the sidebar's device selection (default: auto, or cpu with --device cpu)")
    parser.add_argument("--pause", type=float, default=1.0,
                        help="scale of the waits between cells (default: %(default)s)")
    args = parser.parse_args(argv)
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else None)
    if device is None:
        parser.error("torch sees no CUDA device: pass --device cpu to record on the host")
    sidebar_device = args.sidebar_device or ("cpu" if device == "cpu" else "auto")
    stream = record(device, sidebar_device, max(args.pause, 0.0))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(stream, indent=1) + "\n")
    counts = ", ".join(f"{n} {k}" for k, n in sorted(stream["counts"].items()))
    where = ", ".join(stream["gpus"]) or "the host"
    print(f"wrote {out}: {len(stream['messages'])} messages ({counts}) on {device} ({where})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
