"""The keys docs/PROTOCOL.md lists for each result object (read from its ``jsonc``
examples), and :func:`check`, which holds an object's JSON to them."""
from __future__ import annotations

import re
from pathlib import Path

PROTOCOL = Path(__file__).resolve().parents[2] / "docs" / "PROTOCOL.md"

#: keys a result has that the protocol does not list (none: every key is documented)
UNLISTED: dict[str, set[str]] = {}


# -- the protocol's key lists ------------------------------------------------------------------
def jsonc_keys(block: str) -> tuple[dict, set]:
    """``path -> keys in order`` of a jsonc example (a path: the keys down to an object,
    ``"[]"`` for a list's items) and the ``(path, key)`` marked optional: a comment that
    begins "optional" or "only" after the key that began its line."""
    keys: dict[tuple, list[str]] = {}
    optional: set[tuple] = set()
    stack: list[tuple[str, tuple]] = []
    key, i = None, 0
    last: tuple | None = None        # the last key that began a line
    line_begins = True
    while i < len(block):
        c = block[i]
        if c == '"':
            end = i + 1
            while block[end] != '"':
                end += 2 if block[end] == "\\" else 1
            text, i = block[i + 1:end], end + 1
            rest = block[i:].lstrip(" ")
            if rest.startswith(":") and stack and stack[-1][0] == "{":
                path = stack[-1][1]
                keys.setdefault(path, [])
                if text not in keys[path]:
                    keys[path].append(text)
                key = text
                if line_begins:
                    last, line_begins = (path, text), False
            continue
        if block.startswith("//", i):
            end = block.find("\n", i)
            end = len(block) if end < 0 else end
            comment = block[i + 2:end].strip()
            if last and comment.startswith(("optional", "only")):
                optional.add(last)
            i = end
            continue
        if c == "\n":
            line_begins = True
        elif c in "{[":
            if not stack:
                path = ()
            elif stack[-1][0] == "{":
                path = stack[-1][1] + (key,)
            else:
                path = stack[-1][1] + ("[]",)
            stack.append((c, path))
        elif c in "}]":
            stack.pop()
        i += 1
    return keys, optional


def _protocol() -> dict[str, tuple[dict, set]]:
    """The protocol's examples by the object they show."""
    text = PROTOCOL.read_text()
    out = {}
    for block in re.findall(r"```jsonc\n(.*?)```", text, re.S):
        keys, optional = jsonc_keys(block)
        top = keys[()]
        schema = re.search(r'"schema": "jupyter_gpumem\.(\w+)/1"', block)
        name = ({"snapshot": "Snapshot", "cluster": "ClusterSnapshot", "purge": "PurgeResult",
                 "processes": "ProcessReport", "orphans": "OrphanPurge",
                 "kernels": "ServerKernels"}
                [schema.group(1)] if schema else
                {"id": "DeviceUsage", "label": "Internal"}.get(top[0])
                or ("ClusterHolder" if "what" in top else "Holder"))
        out[name] = (keys, optional)
    rows = re.search(r'also has `"rows"`: one per storage, `\{(.*?)\}`', text, re.S).group(1)
    out["TensorRow"] = ({(): re.findall(r'"(\w+)"', rows)}, set())
    return out


DOCUMENTED = _protocol()


def check(name: str, data: dict, path: tuple = ()) -> None:
    """``data`` (one object's JSON) has every key the protocol lists for ``name`` at
    ``path`` (an optional one may be absent), no other (but :data:`UNLISTED`), in order."""
    keys, optional = DOCUMENTED[name]
    listed = keys[path]
    got = list(data)
    extra = [k for k in got if k not in listed and k not in UNLISTED.get(name, ())]
    missing = [k for k in listed if k not in got and (path, k) not in optional]
    assert (extra, missing) == ([], []), f"{name} {path}: not listed {extra}, missing {missing}"
    assert [k for k in got if k in listed] == [k for k in listed if k in got], (name, path)
