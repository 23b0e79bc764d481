"""The :class:`Tracer`: turns the framework's recording on and off, hears of cells, says
what it records and what that costs (its queries: :mod:`.queries`)."""
from __future__ import annotations

import threading
import time
from typing import Any, Callable

from ...backends import REGISTRY, Backend
from ...backends.base import TraceCost as Cost
from ..cells import hook_cells, unhook_cells
from ..scan import collect_roots, scan
from ..cells import CellNames, CellSpans
from .sites import Resolver
from .hook import AfterImport
from .index import SnapshotIndex
from .queries import Queries
from .save import dump, frame_cells_by_time, host_snapshot, rename_cells
from ...backends.base import is_a

#: allocator events the framework keeps (a ring buffer); each costs host memory while kept
DEFAULT_MAX_ENTRIES = 100_000
STACKS = ("python", "all")
CONTEXTS = ("alloc", "all")
#: ``cell``: the history without stacks, each block mapped to its cell by time;
#: ``lines``: with Python stacks, the line and its source
DEPTHS = ("cell", "lines")
#: while the history holds fewer events than this, reading it after a cell is cheap:
#: the sites of the live blocks are kept then (and whenever a quarter of it turned over)
REFRESH_SMALL = 5_000
#: cells kept by a tracer that records its own spans (no session given)
OWN_SPANS = 20_000


def run_code_of(shell: Any) -> Any:
    fn = getattr(type(shell), "run_code", None)
    return getattr(fn, "__code__", None)


class NoFeed:
    """The feed where no backend gives one: no device history to record."""

    name = ""

    def state(self) -> str:
        return "unavailable"

    def key(self) -> None:
        return None

    def allocations(self) -> None:
        return None


def trace_source() -> tuple[Backend | None, Any]:
    """The backend trace follows (the first, in report order, with a feed) and its feed."""
    for backend in REGISTRY.backends:
        feed = backend.trace_feed()
        if feed is not None:
            return backend, feed
    return None, None


def host_storages(shell: Any) -> set:
    """The pointers of the host storages the shell's names reach now (to tell, once
    trace is on, what was allocated before)."""
    try:
        result = scan(collect_roots(None, shell), devices={"cpu"}, shell=shell, time_limit=2.0)
    except Exception:  # noqa: BLE001 - without it, storages only lack the note
        return set()
    return {k[1] for reach in result.reach for k in reach.storages
            if is_a(k, tuple) and k[0] == "cpu"}


class Tracer(Queries):
    """One recording at a time (the framework's recording is process-wide). ``backend``:
    the framework it follows; ``feed``: its device allocator's history (or a test's);
    ``host``: its host recorder; ``spans``: the record of cell spans it maps times to
    (the session's, else one of its own that it fills from the cell events)."""

    def __init__(self, shell: Any, device: str = "auto", *, depth: str = "cell",
                 stacks: str = "python", context: str = "alloc",
                 max_entries: int = DEFAULT_MAX_ENTRIES, feed: Any = None,
                 measure: bool = True, cells: tuple[Callable, Callable] | None = None,
                 spans: CellSpans | None = None) -> None:
        if depth not in DEPTHS:
            raise ValueError(f"depth must be one of {', '.join(DEPTHS)} (got {depth!r})")
        if stacks not in STACKS:
            raise ValueError(f"stacks must be one of {', '.join(STACKS)} (got {stacks!r})")
        if context not in CONTEXTS:
            raise ValueError(f"context must be one of {', '.join(CONTEXTS)} (got {context!r})")
        if int(max_entries) < 1:
            raise ValueError("max_entries must be at least 1")
        self.shell = shell
        #: how trace hears of cells: ``(hook, unhook)``, each ``f(shell, pre, post)``; the
        #: extension passes its session's, so the shell has one pair of hooks (see session.py)
        self._hooks = cells if cells is not None else (hook_cells, unhook_cells)
        self.own_spans = spans is None
        self.spans = CellSpans(OWN_SPANS) if spans is None else spans
        self._open: list = []          # own spans of cells running
        self.device = device
        self.depth = depth
        self.stacks, self.context, self.max_entries = stacks, context, int(max_entries)
        self.backend, own = trace_source()
        self.feed = feed if feed is not None else own if own is not None else NoFeed()
        self.module = self.backend.module if self.backend is not None else ""
        self.framework = self.backend.name if self.backend is not None else "its framework"
        self.cells = CellNames(shell)
        self.want_cuda = device in ("auto", "all") or device.startswith("cuda")
        self.want_host = device in ("cpu", "all")   # auto: decided once the framework is there
        self.auto = device == "auto"
        self.do_measure = measure
        self.cuda = "off"          # off | waiting-import | waiting-init | on | unavailable
        self.host: Any = None      # the backend's host recorder
        self.host_state = "off"    # off | waiting-import | waiting-thread | on
        self.cuda_cost: Cost | None = None
        self.host_cost: Cost | None = None
        self.started = time.time()
        self.allocs_at_start: int | None = None
        self.before: dict[int, set] = {}
        self.before_host: set = set()
        self._hook: AfterImport | None = None
        self._cancel_init: Callable[[], None] | None = None
        self._index: tuple | None = None     # (key, SnapshotIndex)
        self._carry: dict = {}               # (device, addr, size) -> site of a frameless block
        self._unknown: set = set()           # blocks with no site at the last snapshot
        self._refreshed_at: float | None = None
        self._allocs_at_refresh: int | None = None
        #: the snapshots read after cells to keep the live blocks' sites: how many, seconds
        self.refreshes = [0, 0.0]
        self._messages: list[str] = []
        self.active = False

    # -- on / off ------------------------------------------------------------------------
    def start(self) -> str:
        self.active = True
        self._register_events()
        there = self.feed.state() != "absent" or self._framework_there()
        if not there and self.module and (self.want_cuda or self.want_host):
            self._hook = AfterImport(self.module, self._framework_imported)
            self._hook.install()
            if self.want_cuda:
                self.cuda = "waiting-import"
            if self.want_host or self.auto:
                self.host_state = "waiting-import"
        else:
            self._framework_imported(None, there=True)
        return self.status()

    def _framework_there(self) -> bool:
        return self.backend is not None and self.backend.is_active()

    def _framework_imported(self, _module, there: bool = False) -> None:
        if not self.active:
            return
        state = self.feed.state()
        if self.want_cuda:
            if state == "ready":
                self._enable_cuda()
            elif state == "lazy":
                self.cuda = "waiting-init"
                self._cancel_init = self.feed.on_init(self._on_cuda_init)
            else:
                self.cuda = "unavailable"
        if self.auto:
            self.want_host = self.cuda == "unavailable" and self._framework_there()
        if self.want_host and self._framework_there():
            self._start_host(there)
        elif self.host_state == "waiting-import":
            self.host_state = "off"

    def _on_cuda_init(self) -> None:
        """Inside the framework's lazy CUDA init: start recording before the first
        allocation. Never raises (the framework would fail the user's first CUDA call)."""
        try:
            if self.active and self.cuda == "waiting-init":
                self._enable_cuda()
        except Exception as exc:  # noqa: BLE001
            self.cuda = "unavailable"
            self._messages.append(f"CUDA recording could not start: {type(exc).__name__}: {exc}")

    def _enable_cuda(self) -> None:
        feed = self.feed
        try:
            data = feed.snapshot()   # no history yet: cheap; what exists now has no record
            self.before = {}
            for seg in data.get("segments") or ():
                dev = int(seg.get("device", 0))
                addr = int(seg.get("address", 0))
                for b in seg.get("blocks") or ():
                    size = int(b.get("size", 0))
                    at = int(b.get("address", addr))
                    if b.get("state") != "inactive":
                        self.before.setdefault(dev, set()).add((at, size))
                    addr = at + size
        except Exception:  # noqa: BLE001
            self.before = {}
        # at cell depth no context: torch records the history (with times), no stack
        context = self.context if self.depth == "lines" else None

        def enable(clear: bool = False) -> None:
            feed.enable(stacks=self.stacks, context=context, max_entries=self.max_entries,
                        clear=clear)

        if self.do_measure:
            try:
                self.cuda_cost = feed.measure(enable)
            except Exception as exc:  # noqa: BLE001
                self._messages.append(f"cost not measured: {type(exc).__name__}: {exc}")
                enable()
            enable(clear=True)   # the measurement's events go
        else:
            enable(clear=True)
        self.cuda = "on"
        self.allocs_at_start = self._allocs_at_refresh = feed.allocations()
        self._refreshed_at = time.time()
        self._index = None

    def _start_host(self, there: bool) -> None:
        if self.host is None:
            self.host = self.backend.host_recorder(self.cells, self.max_entries,
                                                   run_code_of(self.shell))
            if self.host is None:
                self.host_state = "unavailable"
                return
            self.host.frames = self.depth == "lines"
        if there:
            # turned on with the framework in use: what the names hold now came before
            self.before_host = host_storages(self.shell)
        if self.do_measure and self.host_cost is None:
            try:
                self.host_cost = self.host.measure()
            except Exception as exc:  # noqa: BLE001
                self._messages.append(f"host cost not measured: {type(exc).__name__}: {exc}")
        if threading.get_ident() == self._shell_thread:
            self.host.push()
            self.host_state = "on"
        else:
            self.host_state = "waiting-thread"   # pushed by the next pre_run_cell

    def stop(self) -> str:
        was = self.active
        self.active = False
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self._cancel_init is not None:
            try:
                self._cancel_init()
            except Exception:  # noqa: BLE001
                pass
            self._cancel_init = None
        if self.cuda == "on":
            try:
                self.feed.disable()
            except Exception as exc:  # noqa: BLE001
                self._messages.append(f"CUDA recording could not stop: {exc}")
        self.cuda = "off"
        if self.host is not None:
            try:
                self.host.pop()
            finally:
                self.host.clear()
            self.host = None
        self.host_state = "off"
        self._unregister_events()
        self._index = None
        self._carry.clear()
        return "trace is off" if was else "trace was off"

    # -- cells --------------------------------------------------------------------------
    def _register_events(self) -> None:
        self._shell_thread = threading.get_ident()
        self._hooks[0](self.shell, self._pre, self._post)

    def _unregister_events(self) -> None:
        self._hooks[1](self.shell, self._pre, self._post)

    def _pre(self, info=None) -> None:
        if self.own_spans:
            span = self.spans.begin(self.shell, info, time.time()) if not self._open else None
            self._open.append(span)
        if self.host is not None and self.host_state == "waiting-thread" \
                and threading.get_ident() == self._shell_thread:
            self.host.push()
            self.host_state = "on"

    def _post(self, result=None) -> None:
        if self.own_spans and self._open:
            span = self._open.pop()
            if span is not None:
                self.spans.end(span, time.time(), result)
        if not self._open or not self.own_spans:
            self._keep_sites()

    def _keep_sites(self) -> None:
        """After a cell: read the history while it is small, or when a quarter of it has
        turned over since the last read, so that the live blocks keep their sites once
        their events leave the ring."""
        if self.cuda != "on":
            return
        try:
            now = self.feed.allocations()
            if now is None or self._allocs_at_refresh is None or now == self._allocs_at_refresh:
                return
            small = 3 * (now - (self.allocs_at_start or 0)) < REFRESH_SMALL
            if small or 4 * (now - self._allocs_at_refresh) > self.max_entries:
                t = time.perf_counter()
                self.index()
                self.refreshes[0] += 1
                self.refreshes[1] += time.perf_counter() - t
        except Exception as exc:  # noqa: BLE001 - never into the user's cell
            self._messages.append(f"sites not kept: {type(exc).__name__}: {exc}")

    def cell_at(self, t: float) -> int | None:
        """The cell that was running at time ``t`` (seconds since the epoch)."""
        n = self.spans.at(t)
        return n if type(n) is int else None

    # -- the visualizer's file ------------------------------------------------------------
    def save(self, path: str, device: str | None = None) -> str:
        if device in (None, "all") or str(device).startswith("cuda"):
            if self.cuda == "on":
                data = self.feed.snapshot()
                timed = 0
                if self.depth == "cell":
                    timed = frame_cells_by_time(data, self.spans.at, self.block_cells(data))
                renamed = rename_cells(data, self.cells)
                dump(path, data)
                what = (f"{timed} block(s) and event(s) given their cell's frame In[N] (cell "
                        f"depth: no stacks)" if self.depth == "cell"
                        else f"{renamed} cell frame(s) named In[N]")
                return (f"saved the CUDA allocator's snapshot to {path} ({what}; open it at "
                        f"https://pytorch.org/memory_viz)")
            if device not in (None, "all"):
                raise RuntimeError(f"nothing recorded on {device}: trace is {self._cuda_words()}")
        if self.host is not None:
            data = self.host_snapshot()
            dump(path, data)
            n = len(data["segments"])
            return (f"saved {n} host storage(s) with their sites to {path}, in the format of "
                    f"torch.cuda.memory._snapshot() (device 0 stands for the host)")
        raise RuntimeError("nothing recorded: turn trace on first (`%gpumem trace on`)")

    def block_cells(self, data: dict) -> dict:
        """``(device, address)`` -> the cell of each active block of a snapshot, as the
        queries find it (its event's time, or what was kept once its event left)."""
        res = Resolver(self.cells)
        out = {}
        for dev in SnapshotIndex(data).devices.values():
            for b in dev.blocks:
                n = self.block_site(dev, b, res).cell
                if n is not None:
                    out[(dev.index, b.addr)] = n
        return out

    def host_snapshot(self) -> dict:
        """The host's records shaped like ``torch.cuda.memory._snapshot()``."""
        return host_snapshot(self.host, self.cells, self.spans.at)

    # -- words --------------------------------------------------------------------------
    def _cuda_words(self) -> str:
        return {"off": "off", "waiting-import": f"waiting for `import {self.module}`",
                "waiting-init": f"waiting for {self.framework} to initialise CUDA",
                "on": "recording", "unavailable": "not available (no CUDA device)"}[self.cuda]

    def since_text(self) -> str | None:
        """The measured cost per allocation times the allocations since trace was on,
        against the time cells ran meanwhile."""
        if self.cuda != "on" or self.cuda_cost is None or self.allocs_at_start is None:
            return None
        now = self.feed.allocations()
        if now is None:
            return None
        count = max(now - self.allocs_at_start, 0)
        spent = count * self.cuda_cost.extra
        cells = self.spans.seconds
        share = f", {spent / cells:.1%} of the {cells:.1f} s cells ran" if cells > 0 else ""
        return f"{count:,} CUDA allocations since on, about {spent:.2f} s of recording{share}"

    def depth_words(self) -> str:
        if self.depth == "cell":
            return "cell depth: the history without stacks"
        return f"lines: {self.stacks} stacks"

    def host_kept_words(self) -> str | None:
        """How many of the host's events are kept, and the limit (``--max-entries``)."""
        host = self.host
        if host is None or self.host_state != "on":
            return None
        kept = getattr(host, "kept", None)
        if kept is None:
            return None
        n = kept()
        limit = getattr(host, "max_entries", self.max_entries)
        words = f"{n:,} host event(s) kept of at most {limit:,}"
        if n >= limit:
            words += " (the oldest go first)"
        dropped = getattr(host, "dropped", 0)
        if dropped:
            words += f"; {dropped:,} older storage(s) lost their site"
        return words

    def status(self) -> str:
        """One line: what is recorded, and its measured cost."""
        if not self.active:
            return "trace is off"
        parts = []
        if self.auto and self.cuda == "waiting-import":
            parts.append(f"waiting for `import {self.module}` (then CUDA's allocator where "
                         f"{self.framework} sees a GPU, else the host)")
            if self.do_measure:
                parts.append("its cost is measured when recording starts (`%gpumem trace`)")
        elif self.want_cuda:
            what = self._cuda_words()
            if self.cuda == "on":
                what = f"recording ({self.depth_words()}, at most {self.max_entries:,} events kept)"
            parts.append(f"CUDA {what}")
            if self.cuda_cost is not None:
                parts.append("cost " + self.cuda_cost.text)
            elif self.cuda in ("waiting-import", "waiting-init") and self.do_measure:
                parts.append("its cost is measured when recording starts (`%gpumem trace`)")
        if (self.host_state != "off" or self.want_host) and not (
                self.auto and self.cuda == "waiting-import"):
            words = {"on": f"recording {self.framework} calls' results"
                     + (" (cell depth: no stacks)" if self.depth == "cell" else " (lines)"),
                     "waiting-import": f"waiting for `import {self.module}`", "waiting-thread":
                     "starts with the next cell", "off": "off", "unavailable":
                     f"not available ({self.framework} has no host recorder)"
                     }.get(self.host_state, self.host_state)
            parts.append(f"host {words}")
            kept = self.host_kept_words()
            if kept:
                parts.append(kept)
            if self.host_cost is not None:
                parts.append("cost " + self.host_cost.text)
        since = self.since_text()
        if since:
            parts.append(since)
        parts += self._messages[-2:]
        return "trace is on: " + " · ".join(parts)
