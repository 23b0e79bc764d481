"""The one reader of the server's JSON request bodies: bounded in size and depth, with
no key twice and no NaN or Infinity. Anything else is a :class:`BadBody` (the handlers
answer it with HTTP 400 and its message); nothing is run for a body that is refused."""
from __future__ import annotations

import json

MAX_BODY = 4096          # bytes
MAX_DEPTH = 16           # objects and arrays inside each other


class BadBody(ValueError):
    """A request body that is refused, and why (one line)."""


def depth(text: str) -> int:
    """How deep the objects and arrays of JSON ``text`` nest (strings skipped)."""
    deepest = level = 0
    in_string = escaped = False
    for c in text:
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "[{":
            level += 1
            if level > deepest:
                deepest = level
        elif c in "]}":
            level -= 1
    return deepest


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict:
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise BadBody(f"the key {json.dumps(key)[:80]} is given twice")
        out[key] = value
    return out


def _no_constant(name: str):
    raise BadBody(f"{name} is not a JSON value")


def parse(body: bytes | None, default: object = None) -> object:
    """The JSON value of ``body`` (``default`` where it is empty), or :class:`BadBody`."""
    if not body:
        return default
    if len(body) > MAX_BODY:
        raise BadBody(f"the body is over {MAX_BODY} bytes")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise BadBody("the body must be UTF-8 JSON") from None
    if depth(text) > MAX_DEPTH:
        raise BadBody(f"the body nests deeper than {MAX_DEPTH} levels")
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except BadBody:
        raise
    except (ValueError, RecursionError):
        raise BadBody("the body must be JSON") from None
