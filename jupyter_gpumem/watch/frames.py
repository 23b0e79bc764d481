"""Where a watch runs: the caller's frame, the running IPython shell, the cell's number,
and showing a report there (no IPython import: ``sys.modules`` tells whether it runs)."""
from __future__ import annotations

import sys
from typing import Any


def caller_frame():
    """The first frame outside this package that called into it."""
    frame = sys._getframe(1)
    while frame is not None and str(frame.f_globals.get("__name__", "")).startswith("jupyter_gpumem"):
        frame = frame.f_back
    return frame


def running_shell():
    """The IPython shell running now, if IPython is imported and one runs."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return None
    try:
        return ipython.get_ipython()
    except Exception:  # noqa: BLE001
        return None


def current_count(shell: Any) -> int | None:
    """The number of the cell running now: what IPython's display hook files ``Out[N]`` under."""
    try:
        return int(shell.displayhook.prompt_count)
    except Exception:  # noqa: BLE001
        return getattr(shell, "execution_count", None)


def cell_label(shell: Any) -> str:
    n = current_count(shell)
    return f"In [{n}]" if n is not None else "cell"


def show(result: Any) -> None:
    """Display ``result`` as IPython's ``display()`` does where a shell runs, else print it."""
    ip = running_shell()
    if ip is None:
        print(repr(result))
        return
    data, metadata = ip.display_formatter.format(result)
    if data:
        ip.display_pub.publish(data=data, metadata=metadata)
