"""Every other process that holds a GPU, named, and what it is to this kernel.

NVML lists the processes on each device; psutil, the parent chain and the environment a
Jupyter kernel gives its processes tell each one's relation (``child``, ``kernel``,
``kernel_child``, ``orphan``, ``ancestor``, ``other_user``, ``own``) or count it as
hidden. Ending a process takes a proof (:func:`judge`, the one place it is decided: the
kernel's mark, :data:`KERNEL_MARK`, set by :func:`mark_kernel`); in doubt a process is
listed, never ended. :mod:`.orphans` ends the ``purgeable`` ones. The relations and the
proof: docs/ARCHITECTURE.md#the-other-processes.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import psutil

from ...backends import nvml
from ...units import JsonFields, Report, fmt_bytes, html_table, json_field, text_table
from ...units import shorten as _shorten
from ..render import code_html
from .table import MAX_DEPTH, Table, snapshot

#: device files a process with a GPU context holds open; a listed pid of this user that
#: holds none of them is not the process NVML means (another PID namespace's pid).
#: ``JUPYTER_GPUMEM_DEVICE_FILES`` (prefixes, ``:``-separated) adds others.
GPU_DEVICE_FILES: tuple[str, ...] = ("/dev/nvidia", "/dev/dri/", "/dev/kfd") + tuple(
    p for p in os.environ.get("JUPYTER_GPUMEM_DEVICE_FILES", "").split(":") if p)

#: names of processes that adopt orphans: init and the usual subreapers of containers
#: and user sessions
REAPERS = frozenset({"init", "systemd", "tini", "tini-static", "dumb-init", "docker-init",
                     "catatonit", "s6-svscan", "runit", "runsvdir", "supervisord", "launchd"})

#: environment a Jupyter kernel's processes inherit from the server that started it
KERNEL_ENV = "JPY_PARENT_PID"
PATH_ENV = "JPY_SESSION_NAME"
#: what the extension puts in the kernel's environment when it loads: ``pid:start time``
#: of the kernel, inherited by every process it starts afterwards
KERNEL_MARK = "JUPYTER_GPUMEM_KERNEL"
#: seconds two readings of one process's start time may differ by
SAME_START = 0.05

COMMAND_WIDTH = 60


@dataclass
class KernelRef:
    """A kernel of the Jupyter server: its id (where the server told it) and path."""

    pid: int
    path: str | None = None
    kernel_id: str | None = None


@dataclass
class GpuProcess(JsonFields):
    """One process on a device, not this one. Its JSON: ``GpuProcess`` of docs/PROTOCOL.md."""

    pid: int
    nbytes: int | None = json_field(key="bytes")
    relation: str = "own"
    label: str = ""
    user: str | None = None
    command: str = ""
    started: float | None = None
    seconds: float | None = None
    ppid: int | None = None
    path: str | None = None          # the notebook (a kernel's, or the kernel an orphan left)
    kernel_id: str | None = None
    purgeable: bool = False
    lists: list[str] = field(default_factory=list)


@dataclass
class DeviceProcesses(JsonFields):
    """The processes on one device other than this one, largest first, and what NVML
    lists but this machine cannot name. Its JSON: ``DeviceProcesses`` of docs/PROTOCOL.md."""

    device: str
    nvml_index: int | None
    processes: list[GpuProcess] = field(default_factory=list)
    this_process: int | None = None
    hidden: int = 0
    hidden_bytes: int | None = 0
    note: str | None = None

    @property
    def others_bytes(self) -> int:
        """Bytes of the named processes (hidden ones apart)."""
        return sum(p.nbytes or 0 for p in self.processes)

    def summary(self) -> str | None:
        return summary_line(self)


@dataclass
class Context:
    """Whom the relations are relative to: a process (a kernel, or the server), its
    parent chain, its user, the server that started it and that server's kernels; with a
    ``table`` (:func:`.table.snapshot`), every question about many processes (parents,
    names, start times) is answered from that one pass, else read live (a purge's
    re-check reads live)."""

    me: int
    uid: int
    ancestors: frozenset
    server_pid: int | None
    kernels: dict[int, KernelRef] = field(default_factory=dict)
    now: float = field(default_factory=time.time)
    envs: dict = field(default_factory=dict)      # pid -> environment (read once)
    users: dict = field(default_factory=dict)     # uid -> user name (looked up once)
    table: Table | None = None


def context(me: int | None = None, kernels: dict[int, KernelRef] | None = None,
            server_pid: int | None = None, table: Table | None = None) -> Context:
    """The context of process ``me`` (default: this one). ``kernels``: the server's own
    list (the server extension gives it); without, a kernel of the same server is known
    by its environment. ``server_pid``: default this process's ``JPY_PARENT_PID``.
    ``table``: one pass over the process table to answer from (default: read live)."""
    me = os.getpid() if me is None else me
    if server_pid is None:
        try:
            server_pid = int(os.environ.get(KERNEL_ENV, "") or 0) or None
        except ValueError:
            server_pid = None
    return Context(me, os.getuid(), frozenset(_ancestors(me, table)), server_pid,
                   dict(kernels or {}), table=table)


def _ancestors(pid: int, table: Table | None = None) -> list[int]:
    if table is not None:
        return table.ancestors(pid)
    out: list[int] = []
    try:
        proc = psutil.Process(pid)
        for _ in range(MAX_DEPTH):
            ppid = proc.ppid()
            if ppid <= 0 or ppid in out:
                break
            out.append(ppid)
            proc = psutil.Process(ppid)
    except (psutil.Error, OSError):
        pass
    return out


def _environ(ctx: Context, pid: int) -> dict:
    if pid not in ctx.envs:
        try:
            ctx.envs[pid] = psutil.Process(pid).environ()
        except (psutil.Error, OSError):
            ctx.envs[pid] = {}
    return ctx.envs[pid]


def holds_gpu_file(pid: int) -> bool | None:
    """Whether process ``pid`` holds a GPU device file open; ``None``: cannot be read.
    The last descriptors first (Linux lists them in order, and a driver's files are
    opened when the process first touches the GPU, after its start-up's): the answer is
    the same in any order, found sooner in this one."""
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return None
    for name in reversed(names[:65536]):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue
        if target.startswith(GPU_DEVICE_FILES):
            return True
    return False


def shorten(text: str, width: int = COMMAND_WIDTH) -> str:
    """A command line on one line (its runs of spaces as one), cut to ``width``."""
    return _shorten(" ".join(text.split()), width)


def _command(proc: psutil.Process) -> str:
    try:
        parts = proc.cmdline()
    except (psutil.Error, OSError):
        parts = []
    if not parts:
        try:
            return f"[{proc.name()}]"
        except (psutil.Error, OSError):
            return "?"
    return shorten(" ".join([os.path.basename(parts[0])] + parts[1:]))


def _child_kind(proc: psutil.Process, parent: int) -> str:
    """DataLoader worker or multiprocessing fork, multiprocessing spawn, or subprocess."""
    try:
        line = " ".join(proc.cmdline())
    except (psutil.Error, OSError):
        return "subprocess"
    if "multiprocessing" in line:
        return "multiprocessing"
    try:
        if proc.cmdline() == psutil.Process(parent).cmdline():
            return "fork: DataLoader worker or multiprocessing"
    except (psutil.Error, OSError):
        pass
    return "subprocess"


def _kernel_of(ctx: Context, pid: int) -> KernelRef | None:
    """``pid`` as a kernel of ctx's server: in the server's list, or by its environment
    (started by the same server, whose child it still is)."""
    if pid == ctx.me:
        return None
    if pid in ctx.kernels:
        return ctx.kernels[pid]
    if ctx.server_pid is None:
        return None
    if ctx.table is not None and ctx.table.ppid(pid) != ctx.server_pid:
        return None                         # (the cheap test first: no environment read)
    env = _environ(ctx, pid)
    try:
        started_by = int(env.get(KERNEL_ENV, "") or 0)
        ppid = ctx.table.ppid(pid) if ctx.table is not None else psutil.Process(pid).ppid()
    except (ValueError, psutil.Error, OSError):
        return None
    if started_by == ctx.server_pid and ppid == ctx.server_pid:
        return KernelRef(pid, env.get(PATH_ENV) or None)
    return None


def orphaned(parent: int, table: Table | None = None) -> bool:
    """Whether a process whose parent is ``parent`` has no live parent of its own: init,
    a subreaper, or none visible here (``table``: as that pass saw them)."""
    if parent <= 1:
        return True
    if table is not None:
        name = table.name(parent)
        return name is None or name in REAPERS
    try:
        return psutil.Process(parent).name() in REAPERS
    except (psutil.Error, OSError):
        return True


def since_boot(proc: psutil.Process) -> float:
    """Seconds from the machine's boot to ``proc``'s start (a fresh ``psutil.Process``):
    what the kernel keeps (clock ticks since boot), which no change of the wall clock
    moves. psutil's ``create_time()`` adds the boot time as the wall clock now puts it
    (an NTP step of 22 s moved it, and a live kernel looked gone): that boot time is
    read first, and taken off."""
    boot = psutil.boot_time()
    return proc.create_time() - boot


def mark(pid: int, started: float, server: str | None) -> str:
    """The value of :data:`KERNEL_MARK` for kernel ``pid`` started ``started`` seconds
    after boot (:func:`since_boot`), a kernel of ``server`` (its ``JPY_PARENT_PID``;
    empty outside a Jupyter server). (The ``b`` after the start says it is counted from
    boot: a reader of the earlier form, a wall-clock time, cannot read it, and takes the
    process as one with no mark, which is never ended on a mark's word.)"""
    return f"{pid}:{started!r}b:{server or ''}"


def mark_kernel(environ=None) -> None:
    """Put this process's pid, start time and server into its environment
    (:data:`KERNEL_MARK`), where every process it starts from now on finds the kernel
    that started it."""
    environ = os.environ if environ is None else environ
    try:
        started = since_boot(psutil.Process())
    except (psutil.Error, OSError):
        return
    environ[KERNEL_MARK] = mark(os.getpid(), started, environ.get(KERNEL_ENV))


def marked_kernel(env: dict) -> tuple[int, float, bool] | None:
    """The kernel a process's environment records (pid, start time, whether that time
    is counted from boot: an earlier version's mark has a wall-clock time), or None. A
    mark names the process's kernel only where its server is the process's own: a
    Jupyter server started from a kernel that loaded the extension passes that kernel's
    mark on to its own kernels, and those to their processes, which that kernel did not
    start."""
    parts = str(env.get(KERNEL_MARK, "")).split(":", 2)
    if len(parts) != 3 or parts[2] != str(env.get(KERNEL_ENV, "") or ""):
        return None
    from_boot = parts[1].endswith("b")
    try:
        out = int(parts[0]), float(parts[1][:-1] if from_boot else parts[1]), from_boot
    except ValueError:
        return None
    return out if out[0] > 0 else None


def alive_as(pid: int, started: float, from_boot: bool = True) -> bool | None:
    """Whether the process ``pid`` that started at ``started`` (seconds after boot, or
    with ``from_boot`` false a wall-clock time) is alive: False where the pid is free or
    another process's now; None where it cannot be told."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        now = since_boot(proc) if from_boot else proc.create_time()
        return abs(now - started) <= SAME_START
    except psutil.NoSuchProcess:
        return False
    except (psutil.Error, OSError):
        return None


@dataclass
class Verdict:
    """What :func:`judge` found a process to be: its relation, its words, and whether
    :mod:`.orphans` may end it."""

    relation: str
    label: str
    purgeable: bool = False
    path: str | None = None
    kernel_pid: int | None = None


def _kernel_words(path: str | None, pid: int | None) -> str:
    where = f"of {path}" if path else "(notebook unknown)"
    return f"a kernel {where}" + (f" (pid {pid})" if pid else "")


def _starters(env: dict, started: float, pid: int, ctx: Context | None) -> list[int]:
    """The live kernels that may have started process ``pid`` (no mark in its
    environment): this user's processes that started no later than it, with the same
    server (``JPY_PARENT_PID``) and notebook, that are kernels: in the server's list, a
    child of that server, or with a kernel's command line (a kernel whose server is
    gone)."""
    server, path = env.get(KERNEL_ENV), env.get(PATH_ENV)
    uid = os.getuid()
    out = []
    # the cheap tests first (the table: the raw environment, then the stat of a process
    # whose environment names the server); its command line, owner and environment are
    # read with psutil only for a process that passed them
    table = ctx.table if ctx is not None and ctx.table is not None else snapshot()
    for cand in table.pids():
        if cand == pid or cand <= 1:
            continue
        if server is not None and table.environ_has(cand, KERNEL_ENV, server) is False:
            continue
        row = table.row(cand)
        if row is None or row.name in REAPERS:            # init or a subreaper is no kernel
            continue
        if row.started is None or row.started > started + SAME_START:
            continue
        try:
            proc = psutil.Process(cand)
            if not ((ctx is not None and cand in ctx.kernels) or str(row.ppid) == server
                    or _looks_like_kernel(proc.cmdline() or ())):
                continue
            if proc.uids().real != uid:
                continue
            cenv = proc.environ()
        except (psutil.Error, OSError):
            continue
        if cenv.get(KERNEL_ENV) == server and (not path or cenv.get(PATH_ENV) == path):
            out.append(cand)
    return out


def _looks_like_kernel(cmdline) -> bool:
    """An IPython kernel's command line (``-m ipykernel_launcher -f .../kernel-ID.json``)."""
    return any("ipykernel" in a or (os.path.basename(a).startswith("kernel-")
                                    and a.endswith(".json")) for a in cmdline)


def judge(pid: int, ppid: int, env: dict, started: float | None,
          ctx: Context | None = None) -> Verdict | None:
    """Rule 3, the one place it is decided: process ``pid`` is an orphan only when the
    kernel that started it is provably gone AND it has no live parent other than init
    or a subreaper; in doubt it is listed as what it is and never ended. None: no
    orphan and nothing to say (its parent is alive and no kernel is known to it)."""
    mark = marked_kernel(env)
    path = env.get(PATH_ENV) or None
    table = ctx.table if ctx is not None else None
    if mark is not None:
        kpid, kstart, from_boot = mark
        alive = alive_as(kpid, kstart, from_boot)
        me = os.getpid() if ctx is None else ctx.me
        if alive is not False:
            who = "this kernel" if kpid == me else _kernel_words(path, kpid)
            state = "which is alive" if alive else "which cannot be read: left alone"
            return Verdict("kernel_child", f"detached by {who}, {state}", path=path,
                           kernel_pid=kpid)
        if not orphaned(ppid, table):
            return Verdict("own", f"started by {_kernel_words(path, kpid)}, now gone; its "
                           f"parent {ppid} {_name(ppid)} is alive: left alone", path=path)
        return Verdict("orphan", f"orphan: left by {_kernel_words(path, kpid)}, which is "
                       "gone", purgeable=True, path=path, kernel_pid=kpid)
    if not orphaned(ppid, table):
        return None
    if KERNEL_ENV not in env:
        return Verdict("orphan", "orphan (parent gone; no kernel started it: left alone)")
    if started is None:
        return Verdict("orphan", "orphan (parent gone; its start time cannot be read: left "
                       "alone)", path=path)
    live = _starters(env, started, pid, ctx)
    if live:
        return Verdict("own", f"parent gone; {_kernel_words(path, live[0])}, which may have "
                       "started it, is alive: left alone", path=path, kernel_pid=live[0])
    return Verdict("orphan", f"orphan: left by {_kernel_words(path, None)} (parent gone; no "
                   "live kernel of it started before it)", purgeable=True, path=path)


def is_orphan(pid: int, ctx: Context | None = None) -> bool:
    """Process ``pid`` is, now, an orphan :mod:`.orphans` may end (:func:`judge`)."""
    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            ppid, started = proc.ppid(), proc.create_time()
        env = proc.environ()
    except (psutil.Error, OSError):
        return False
    verdict = judge(pid, ppid, env, started, ctx)
    return verdict is not None and verdict.relation == "orphan" and verdict.purgeable


def _user_name(ctx: Context, proc: psutil.Process, uid: int) -> str:
    """The name of ``uid``, the owner of ``proc`` (looked up once per context)."""
    if uid not in ctx.users:
        try:
            ctx.users[uid] = proc.username()
        except KeyError:
            ctx.users[uid] = str(uid)
        except psutil.Error:
            return str(uid)
    return ctx.users[uid]


def describe(pid: int, nbytes: int | None, ctx: Context, lists=()) -> GpuProcess | None:
    """``pid`` as a :class:`GpuProcess`; ``None`` where it does not exist here or is
    not the process NVML means (hidden)."""
    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            uid = proc.uids().real
            ppid = proc.ppid()
            started = proc.create_time()
            user = _user_name(ctx, proc, uid)
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return None
    except (psutil.Error, OSError):
        return GpuProcess(pid, nbytes, "other_user", "another user's (cannot be read)",
                          lists=list(lists))
    out = GpuProcess(pid, nbytes, user=user, command=_command(proc), started=started,
                     seconds=max(ctx.now - started, 0.0), ppid=ppid, lists=list(lists))
    if uid != ctx.uid:
        out.relation, out.label = "other_user", f"another user's ({user})"
        return out
    if holds_gpu_file(pid) is False:
        return None
    if pid in ctx.ancestors:
        out.relation, out.label = "ancestor", "this process's parent chain"
        if ctx.server_pid == pid:
            out.label = "the Jupyter server of this kernel"
        return out
    kernel = _kernel_of(ctx, pid)
    if kernel is not None:
        out.relation, out.path, out.kernel_id = "kernel", kernel.path, kernel.kernel_id
        out.label = f"kernel of this server: {kernel.path or 'path unknown'}"
        return out
    chain = _ancestors(pid, ctx.table)  # only now: a kernel of the server's list needs none
    for up in chain:
        if up == ctx.me:
            break
        kernel = _kernel_of(ctx, up)
        if kernel is not None:
            out.relation, out.path, out.kernel_id = "kernel_child", kernel.path, kernel.kernel_id
            out.label = (f"child of the kernel of {kernel.path or f'pid {up}'} "
                         f"({_child_kind(proc, up)})")
            return out
    if ctx.me in chain:
        out.relation = "child"
        out.label = f"this process's child ({_child_kind(proc, ctx.me)})"
        return out
    verdict = judge(pid, ppid, _environ(ctx, pid), started, ctx)
    if verdict is not None:
        out.relation, out.label, out.path = verdict.relation, verdict.label, verdict.path
        out.purgeable = verdict.purgeable and pid != ctx.me and pid not in ctx.ancestors
        return out
    out.label = f"this user's (parent {ppid} {_name(ppid)})"
    return out


def _name(pid: int) -> str:
    try:
        return psutil.Process(pid).name()
    except (psutil.Error, OSError):
        return "?"


def device_processes(device: str, index: int | None, ctx: Context) -> DeviceProcesses:
    """NVML's processes on device ``index``, named (``device``: its id, ``cuda:0``)."""
    out = DeviceProcesses(device, index)
    if index is None:
        out.note = nvml.status() or "not an NVML device"
        return out
    listed = nvml.processes(index)
    if listed is None:
        out.note = nvml.status() or "NVML gives no process list for this device"
        return out
    for entry in listed:
        if entry.pid == ctx.me:
            out.this_process = entry.used
            continue
        proc = describe(entry.pid, entry.used, ctx, entry.lists) if entry.pid > 0 else None
        if proc is None:
            out.hidden += 1
            if out.hidden_bytes is not None:
                out.hidden_bytes = None if entry.used is None else out.hidden_bytes + entry.used
            continue
        out.processes.append(proc)
    out.processes.sort(key=lambda p: (-(p.nbytes or 0), p.pid))
    return out


def read(devices, ctx: Context | None = None) -> list[DeviceProcesses]:
    """The other processes of each accelerator in ``devices`` (``DeviceUsage`` or
    ``(id, nvml_index)``); nothing for ``cpu``."""
    out = []
    with nvml.reading():
        for d in devices:
            dev, index = (d.id, d.nvml_index) if hasattr(d, "id") else d
            if dev == "cpu":
                continue
            ctx = ctx or context()   # (read only where an accelerator is asked about)
            out.append(device_processes(dev, index, ctx))
    return out


def read_all(ctx: Context | None = None) -> list[DeviceProcesses]:
    """Every NVML device, by NVML index (``nvml:N`` where CUDA does not number it here)."""
    visible = {idx: n for n, idx in enumerate(nvml.visible_indices())}
    return read([(f"cuda:{visible[i]}" if i in visible else f"nvml:{i}", i)
                 for i in range(nvml.device_count())], ctx)


# -- words -------------------------------------------------------------------------------
_WORDS = {"child": ("child", "children"), "kernel": ("kernel", "kernels"),
          "kernel_child": ("kernel's child", "kernels' children"),
          "orphan": ("orphan", "orphans"), "ancestor": ("parent", "parents"),
          "other_user": ("of another user", "of other users"),
          "own": ("other of this user", "others of this user")}
_ORDER = ("orphan", "child", "kernel", "kernel_child", "own", "ancestor", "other_user")


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    s = int(seconds)
    if s < 120:
        return f"{s} s"
    if s < 7200:
        return f"{s // 60} min"
    if s < 172800:
        return f"{s // 3600} h {s % 3600 // 60:02d} min"
    return f"{s // 86400} d"


def summary_line(dp: DeviceProcesses) -> str | None:
    """One line under a device: the others, by relation, and the hidden ones."""
    if not dp.processes and not dp.hidden:
        return None
    groups: dict[str, list[GpuProcess]] = {}
    for p in dp.processes:
        groups.setdefault(p.relation, []).append(p)
    parts = []
    for rel in _ORDER:
        procs = groups.get(rel)
        if not procs:
            continue
        n = len(procs)
        word = _WORDS[rel][n > 1]
        if rel == "kernel":
            word += " " + ", ".join(p.path or f"pid {p.pid}" for p in procs)
        parts.append(f"{n} {word} {fmt_bytes(sum(p.nbytes or 0 for p in procs))}")
    if dp.hidden:
        parts.append(f"{dp.hidden} without a pid here {fmt_bytes(dp.hidden_bytes)}")
    line = f"  other processes on {dp.device}: " + " · ".join(parts)
    if any(p.purgeable for p in dp.processes):
        line += " · `%gpumem purge --orphans` ends the orphans"
    return line + " · `%gpumem --processes` lists them"


HEADERS = ["device", "pid", "bytes", "user", "running", "what it is", "command"]


def rows(dps: list[DeviceProcesses]) -> list[list[str]]:
    out = []
    for dp in dps:
        for p in dp.processes:
            out.append([dp.device, str(p.pid), fmt_bytes(p.nbytes), p.user or "?", _age(p.seconds),
                        p.label, p.command])
        if dp.hidden:
            out.append([dp.device, "-", fmt_bytes(dp.hidden_bytes), "?", "?",
                        f"{dp.hidden} process(es) NVML lists without a pid here (another PID "
                        "namespace: the container's host)", ""])
    return out


def notes(dps: list[DeviceProcesses]) -> list[str]:
    return [f"{dp.device}: {dp.note}" for dp in dps if dp.note]


def empty_line(dps: list[DeviceProcesses]) -> str:
    """What an empty table says: "none" only where a process list was read; where NVML
    gave none (a note says why), the product cannot know, and says so."""
    unknown = [dp.device for dp in dps if dp.note]
    if not dps:
        return "cannot know: NVML lists no device (see the note)"
    if len(unknown) == len(dps):
        return "cannot know: NVML gives no process list (see the note)"
    if unknown:
        return f"none (cannot know on {', '.join(unknown)}: NVML gives no process list there)"
    return "none"


@dataclass(repr=False)
class ProcessReport(JsonFields, Report):
    """``%gpumem --processes``: every other process on each device. Its JSON:
    ``"schema": "jupyter_gpumem.processes/1"`` of docs/PROTOCOL.md."""

    schema = "jupyter_gpumem.processes/1"
    JSON_AFTER = {"schema": None, "time": "schema"}

    devices: list[DeviceProcesses]
    pid: int = field(default_factory=os.getpid)
    time: float = field(default_factory=time.time)
    messages: list[str] = field(default_factory=list)

    def _text(self) -> str:
        lines = [f"processes on the GPUs other than this one (pid {self.pid}):"]
        table = rows(self.devices)
        lines += text_table(HEADERS, table, {1, 2}) if table else [empty_line(self.devices)]
        lines += [f"note: {m}" for m in notes(self.devices) + self.messages]
        return "\n".join(lines)

    def _html(self) -> str:
        table = rows(self.devices)
        parts = ["<div class='jupyter-gpumem'>",
                 html_table(HEADERS, table, {1, 2}) if table
                 else f"<div>{code_html(empty_line(self.devices))}</div>"]
        parts += [f"<div><em>note: {code_html(m)}</em></div>"
                  for m in notes(self.devices) + self.messages]
        return "".join(parts) + "</div>"


def report(devices=None, ctx: Context | None = None) -> ProcessReport:
    """The report of ``%gpumem --processes`` (``devices``: ``DeviceUsage``s; default all)."""
    dps = read(devices, ctx) if devices is not None else read_all(ctx)
    msgs = [] if dps or nvml.available() else [nvml.status() or "NVML unavailable"]
    if not dps and not msgs:
        msgs.append("no GPU: NVML sees no device")
    return ProcessReport(dps, messages=msgs)
