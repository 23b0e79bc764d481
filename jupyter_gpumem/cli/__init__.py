"""``jupyter gpumem``: which notebook holds the GPU, from a terminal.

::

    jupyter gpumem [--json] [--timeout S]          every kernel of this user's servers
    jupyter gpumem orphans [--dry-run] [--grace S] [--json]
    jupyter gpumem shutdown PATH [--yes] [--server URL] [--timeout S]

Jupyter runs ``jupyter-gpumem`` (pyproject's ``[project.scripts]``) for ``jupyter gpumem``;
``python -m jupyter_gpumem.cli`` is the same. A bad argument is one line on stderr and
exit status 2; a request that cannot be done (no such notebook, not confirmed, a server
that refuses) one line and status 1. docs/TERMINAL.md is the reference.
"""
from __future__ import annotations

import argparse
import json
import os
import posixpath
import sys

from ..core.processes import orphans as _orphans
from ..core import processes as _processes
from ..units import fmt_bytes
from . import listing as _listing
from . import servers as _servers

PROG = "jupyter gpumem"


class Parser(argparse.ArgumentParser):
    """An argparse parser whose errors are one line (``jupyter gpumem: error: ...``)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


class Failed(Exception):
    """A request that cannot be done: its one line (exit status 1)."""


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < value <= 600:
        raise argparse.ArgumentTypeError(f"must be more than 0 and at most 600 s, not {text!r}")
    return value


def _grace(text: str) -> float:
    try:
        return _orphans.check_grace(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).replace("--grace ", "")) from None


def parser() -> Parser:
    top = Parser(prog=PROG, description="Which notebook holds the GPU: every kernel of this "
                 "user's running Jupyter servers by notebook path, its GPU memory per "
                 "device and its host memory, then the orphans and the other processes on "
                 "the GPUs. Where no server answers, what NVML and the process table say.")
    top.add_argument("--json", action="store_true", help="JSON for scripts "
                     '("schema": "jupyter_gpumem.terminal/1")')
    top.add_argument("--timeout", type=_seconds, default=_servers.TIMEOUT, metavar="S",
                     help=f"seconds to wait for each server (default {_servers.TIMEOUT:g})")
    top.add_argument("--runtime-dir", metavar="DIR", help="where the servers' runtime files "
                     "are (default: Jupyter's runtime directory)")
    sub = top.add_subparsers(dest="command", metavar="{orphans,shutdown}")
    orphans = sub.add_parser("orphans", help="end this user's orphans that hold GPU memory",
                             description="End this user's orphaned processes on the GPUs "
                             "that a Jupyter kernel started (its parent gone), as "
                             "`%gpumem purge --orphans` does: each checked again before "
                             "each signal, SIGTERM, then SIGKILL after the grace period; "
                             "each step printed.")
    orphans.add_argument("--dry-run", action="store_true", help="only name them")
    orphans.add_argument("--grace", type=_grace, default=_orphans.GRACE, metavar="S",
                         help=f"seconds between SIGTERM and SIGKILL (0 to "
                         f"{_orphans.MAX_GRACE:g}; default {_orphans.GRACE:g})")
    orphans.add_argument("--json", action="store_true", dest="sub_json",
                         help="the result as JSON (schema jupyter_gpumem.orphans/1)")
    shutdown = sub.add_parser("shutdown", help="shut down the kernel of a notebook",
                              description="Shut down the kernel of the notebook (or console) "
                              "PATH through its Jupyter server; asks first.")
    shutdown.add_argument("path", metavar="PATH", help="the notebook's path: as the server "
                          "names it (relative to its root), or a path to the file here")
    shutdown.add_argument("--yes", "-y", action="store_true", help="do not ask")
    shutdown.add_argument("--server", metavar="URL", help="the server's URL (where "
                          "several servers run a kernel of PATH)")
    return top


def list_kernels(args) -> int:
    infos = _servers.running(args.runtime_dir)
    asked = _servers.ask_all(infos, "GET", _servers.KERNELS, args.timeout)
    data = _listing.gather(asked)
    print(json.dumps(data, indent=1) if args.json else _listing.text(data))
    return 0


def orphans(args) -> int:
    ctx = _processes.context()
    shown: list[str] = []

    def step(s: _orphans.Step) -> None:
        line = "  " + s.text()
        shown.append(line)
        print(line, flush=True)

    as_json = args.json or args.sub_json
    result = _orphans.purge_orphans(dry_run=args.dry_run, grace=args.grace, ctx=ctx,
                                    on_step=None if as_json else step)
    if as_json:
        print(json.dumps(result.to_json(), indent=1))
    else:
        print("\n".join(line for line in repr(result).splitlines() if line not in shown))
    failed = [s for s in result.steps if s.result.startswith("refused")
              or s.result == "still running"]
    return 1 if failed else 0


def _wanted(path: str, root: str | None) -> set[str]:
    """The server paths that ``path`` may mean: as given, and as a file here under
    the server's root."""
    out = {posixpath.normpath(path.replace(os.sep, "/")).lstrip("/") if not
           os.path.isabs(path) else None}
    if root:
        here = os.path.abspath(path)
        rel = os.path.relpath(here, os.path.abspath(root))
        if not rel.startswith(".."):
            out.add(rel.replace(os.sep, "/"))
    out.discard(None)
    return out


def _kernels_of(asked: _servers.Asked) -> list[dict]:
    """``{"id", "name", "path", "pid", "gpu", "execution_state"}`` of each session's kernel."""
    if isinstance(asked.answer, dict):          # the extension's answer
        return [{**k, "paths": [s.get("path") for s in k.get("sessions") or []]}
                for k in asked.answer.get("kernels", [])]
    out = {}
    for s in asked.answer or []:               # api/sessions
        k = s.get("kernel") or {}
        row = out.setdefault(k.get("id"), {"id": k.get("id"), "name": k.get("name"),
                                           "path": s.get("path"), "pid": None, "gpu": {},
                                           "execution_state": k.get("execution_state"),
                                           "paths": []})
        row["paths"].append(s.get("path"))
    return list(out.values())


def shutdown(args) -> int:
    infos = _servers.running(args.runtime_dir)
    if args.server:
        infos = [i for i in infos if str(i.get("url", "")).rstrip("/") ==
                 args.server.rstrip("/")]
        if not infos:
            raise Failed(f"no running Jupyter server of this user at {args.server}")
    asked = _servers.ask_all(infos, "GET", _servers.KERNELS, args.timeout)
    for n, a in enumerate(asked):
        if a.status == 404:                      # no extension there: the sessions API
            asked[n] = _servers.request(a.info, "GET", "api/sessions", args.timeout)
    found = []
    for a in asked:
        if a.ok:
            wanted = _wanted(args.path, a.info.get("root_dir"))
            found += [(a, k) for k in _kernels_of(a)
                      if wanted & {posixpath.normpath(p) for p in k["paths"] if p}]
    if not found:
        unasked = [f"{a.url} ({a.error})" for a in asked if not a.ok]
        where = f"; not asked: {', '.join(unasked)}" if unasked else ""
        raise Failed(f"no running kernel has the notebook {args.path}"
                     + (where if infos else ": no Jupyter server of this user is running"))
    if len(found) > 1:
        raise Failed(f"{len(found)} kernels have {args.path}: "
                     + "; ".join(f"{k['id']} on {a.url}" for a, k in found)
                     + " (choose with --server URL)")
    (a, k), = found
    held = ", ".join(f"{d} {fmt_bytes(n)}" for d, n in (k.get("gpu") or {}).items())
    what = (f"the kernel of {k['path']} ({k.get('name') or 'kernel'}, pid {k.get('pid') or '?'}, "
            f"{k.get('execution_state') or '?'}{', holds ' + held if held else ''}) on {a.url}")
    if not args.yes:
        print(f"shut down {what}? [y/N] ", end="", flush=True)
        answer = sys.stdin.readline().strip().lower()
        if answer not in ("y", "yes"):
            raise Failed("not shut down (not confirmed)")
    done = _servers.request(a.info, "DELETE", _servers.kernel_url(k["id"]), args.timeout)
    if not done.ok:
        raise Failed(f"the server did not shut it down: {done.error}")
    print(f"shut down {what}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.command == "orphans":
            return orphans(args)
        if args.command == "shutdown":
            return shutdown(args)
        return list_kernels(args)
    except Failed as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
