"""Work in steps: a generator that yields between two parts of its work (so that a
caller on an event loop lets other work run) and returns its answer."""
from __future__ import annotations

from typing import Any, Generator


def run_to_end(steps: Generator) -> Any:
    """Run a generator of steps to its end, here and now; what it returns."""
    try:
        while True:
            next(steps)
    except StopIteration as done:
        return done.value
