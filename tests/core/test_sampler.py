"""One sampling thread per shell: the watch footer, the live panel and the sidebar's
comm channels subscribe to their session's sampler, each at its own interval.

A real IPython shell with the extension loaded, real torch tensors on the CPU,
real ipywidgets for the panel and the real ``comm`` package for the sidebar (its
transport records the messages, as in tests/views/test_comm.py); real threads.
"""
from __future__ import annotations

import threading
import time

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("ipywidgets")
pytest.importorskip("comm")

from conftest import raises_fatal, run  # noqa: E402
from conftest import sampling_threads  # noqa: E402
from recording_comm import open_sidebar, send  # noqa: E402

from jupyter_gpumem.core.sampler import SharedSampler  # noqa: E402
from jupyter_gpumem.session import session_of  # noqa: E402
from jupyter_gpumem.views import comm as gpucomm  # noqa: E402
from jupyter_gpumem.views import panel as panel_mod  # noqa: E402
from jupyter_gpumem.watch import scope as watch_mod  # noqa: E402
from jupyter_gpumem.watch.sampling import PROCESS_SAMPLER  # noqa: E402

WATCH, PANEL, SIDEBAR = 0.05, 0.2, 0.25     # seconds: each subscriber's own interval


@pytest.fixture
def thread_tracebacks(monkeypatch):
    """Every exception that ended a thread (what threading prints into the cell's output)."""
    seen: list = []
    monkeypatch.setattr(threading, "excepthook", lambda args: seen.append(args.exc_type))
    return seen


def _ours() -> list[str]:
    """Every thread of the extension alive."""
    return [t.name for t in threading.enumerate()
            if t.name.startswith("jupyter_gpumem") and t.is_alive()]


@pytest.fixture
def three(ip, capsys):
    """The shell with the watch footer on, the panel open and one sidebar open."""
    run(ip, "import time, torch")
    hub = gpucomm.hub_of(ip)
    for left in hub.channels:   # a sidebar another test file left open on this shell
        left.on_close()
    hub.interval = SIDEBAR
    run(ip, f"%gpumem watch on --device cpu --interval {WATCH}")
    run(ip, f"%gpumem panel --device cpu --interval {PANEL}")
    sidebar = open_sidebar()
    send(sidebar, {"type": "set_device", "device": "cpu"})
    capsys.readouterr()
    yield ip, panel_mod.current(ip), hub, sidebar
    run(ip, "%gpumem watch off")
    panel_mod.close(ip)
    sidebar.handle_close({"content": {"comm_id": sidebar.comm_id, "data": {}}})
    hub.interval = gpucomm.INTERVAL
    watch_mod.history_for(ip).clear()
    assert not sampling_threads()


def _devices_messages(sidebar, since: float, until: float) -> list[tuple[float, str]]:
    return [(d["time"], t) for kind, d, t in sidebar.sent
            if kind == "comm_msg" and d.get("type") == "devices" and since < d["time"] < until]


def test_one_thread_serves_watch_panel_and_sidebar_each_at_its_interval(three):
    ip, panel, hub, sidebar = three
    session = session_of(ip)
    run(ip, "import threading\nduring = [t.name for t in threading.enumerate()"
            " if t.name.startswith('jupyter_gpumem')]")
    assert ip.user_ns["during"] == ["jupyter_gpumem-sampler"]      # one, with all three open
    assert _ours() == ["jupyter_gpumem-sampler"]                     # and between cells
    assert {s.name for s in session.sampler.subscriptions} == {"watch", "panel", "devices"}

    subs = {s.name: s for s in session.sampler.subscriptions}
    # each at the interval it asked for: the thread's schedule, not a count per second
    assert {n: s.interval for n, s in subs.items()} == {"watch": WATCH, "panel": PANEL,
                                                       "devices": SIDEBAR}
    sidebar.clear()
    calls = {n: s.calls for n, s in subs.items()}
    points = len(panel.series.points())
    run(ip, "time.sleep(1.5)")
    got = {n: s.calls - calls[n] for n, s in subs.items()}
    # what each was given during the cell, read from its outputs (a call may be in flight)
    record = watch_mod.history_for(ip)[-1]
    samples = record.device("cpu").samples
    assert _ours() == ["jupyter_gpumem-sampler"]
    # the watch: its start and end readings and one sample per call while the cell ran
    # (a tick after the end pauses it, and is a call that samples nothing)
    assert record.source == "watch on" and samples - 2 <= got["watch"] <= samples - 1
    assert record.device("cpu").process_peak_sampled > 0
    # the panel: a bar reading per call; the sidebar: a devices message per call
    assert got["panel"] - 1 <= len(panel.series.points()) - points <= got["panel"] + 1
    sent = _devices_messages(sidebar, 0, float("inf"))
    assert got["devices"] - 1 <= len(sent) <= got["devices"] + 1
    assert {name for _, name in sent} == {"jupyter_gpumem-sampler"}    # the same thread
    # all three were served while the cell ran, the fastest most often
    assert min(got.values()) >= 2 and got["watch"] > got["panel"] and got["watch"] > got["devices"]

    # all three closed, one by one: the thread stays while one is left, then goes
    run(ip, "%gpumem watch off")
    assert _ours() == ["jupyter_gpumem-sampler"]
    run(ip, "%gpumem panel --close")
    assert panel.closed and _ours() == ["jupyter_gpumem-sampler"]
    thread = session.sampler.thread
    sidebar.handle_close({"content": {"comm_id": sidebar.comm_id, "data": {}}})
    assert not thread.is_alive() and session.sampler.thread is None
    assert _ours() == [] and session.sampler.subscriptions == []
    assert hub.thread is None


def test_subscribers_due_together_share_one_reading(three):
    ip, panel, hub, sidebar = three
    stats = session_of(ip).sampler.stats
    panel.configure(interval=0.25)          # the same interval as the sidebar's
    reads, readings = stats["reads"], stats["readings"]
    run(ip, "time.sleep(1.2)")
    asked, made = stats["reads"] - reads, stats["readings"] - readings
    # the watch, the panel and the sidebar all read "cpu": each tick the panel and the
    # sidebar share, and those of the watch that fall on them, read the devices once
    assert made < asked, (asked, made)
    assert asked - made >= 3


def test_a_failing_subscriber_leaves_the_others_their_readings(three, monkeypatch):
    ip, panel, hub, sidebar = three
    session = session_of(ip)

    monkeypatch.setattr(panel_mod.Panel, "_tick", raises_fatal("no device"))
    run(ip, "%gpumem panel --close")
    run(ip, "%gpumem panel --device cpu --interval 0.1")     # its first reading fails
    panel = panel_mod.current(ip)
    panel.sampler.join(2)
    assert panel.sampler.failure == "Fatal: no device"
    assert "device readings stopped: Fatal: no device" in panel.status.value
    assert _ours() == ["jupyter_gpumem-sampler"]          # the thread goes on for the others

    # one that raises an Exception on every tick goes on too, and so do the others
    def broken(self, *args):
        raise RuntimeError("comm broke")

    monkeypatch.setattr(gpucomm._Hub, "_read", broken)
    sidebar.clear()
    run(ip, "time.sleep(0.8)")
    record = watch_mod.history_for(ip)[-1]
    # the watch went on sampling while the cell ran: more than its start and end readings
    assert record.device("cpu").samples >= 4
    assert not any("sampling stopped" in m for m in record.messages)
    assert _devices_messages(sidebar, 0, float("inf")) == []
    assert hub.thread.errors >= 2 and hub.thread.is_alive()

    monkeypatch.undo()
    sidebar.clear()
    run(ip, "time.sleep(0.6)")
    assert len(_devices_messages(sidebar, 0, float("inf"))) >= 1      # it reads again
    run(ip, "%gpumem panel")                      # shown again: the panel subscribes again
    assert panel.sampler.is_alive() and panel.sampler.failure is None
    assert "device readings started again" in panel.status.value
    count = panel.stats["ticks"]
    time.sleep(0.5)
    assert panel.stats["ticks"] > count
    assert _ours() == ["jupyter_gpumem-sampler"]
    assert {s.name for s in session.sampler.subscriptions} == {"watch", "panel", "devices"}


def test_unload_leaves_no_thread(three):
    ip, panel, hub, sidebar = three
    session = session_of(ip)
    thread = session.sampler.thread
    run(ip, "%unload_ext jupyter_gpumem")
    assert not thread.is_alive() and _ours() == []
    assert panel.closed and session.sampler.closed
    run(ip, "%load_ext jupyter_gpumem")


def test_a_script_watch_without_a_shell_samples_on_a_thread_of_its_own():
    namespace: dict = {}
    own = PROCESS_SAMPLER.stats
    calls = own["calls"]
    with watch_mod.watch(namespace=namespace, device="cpu", interval=0.01, report=False) as w:
        inside = [t.name for t in threading.enumerate() if t.name.startswith("jupyter_gpumem")]
        time.sleep(0.2)
    assert inside == ["jupyter_gpumem-watch"]
    # its start and end readings, and one sample per call of its thread
    samples = w.result.device("cpu").samples
    assert samples == own["calls"] - calls + 2 and samples >= 3
    assert not sampling_threads()


def test_a_sampling_thread_that_dies_tells_every_subscriber(thread_tracebacks):
    from jupyter_gpumem.core import sampler as core_sampler

    sampler = core_sampler.SharedSampler(read=lambda selection: [selection],
                                    name="jupyter_gpumem-test")
    failures: list[tuple[str, str]] = []
    subs = [sampler.subscribe(lambda: None, 0.02, name=n,
                              on_failure=lambda f, n=n: failures.append((n, f)))
            for n in ("a", "b")]
    thread = sampler.thread

    sampler._tick = raises_fatal("the loop broke")   # the loop itself fails, not a subscriber
    thread.join(2)
    assert not thread.is_alive() and sampler.thread is None
    assert sorted(failures) == [("a", "Fatal: the loop broke"), ("b", "Fatal: the loop broke")]
    assert all(s.stopped and not s.is_alive() for s in subs)
    assert sampler.failure == "Fatal: the loop broke" and thread_tracebacks == []
    again = sampler.subscribe(lambda: None, 0.02, name="c")   # a new thread for the next one
    assert again.is_alive() and sampler.failure is None
    sampler.close()
    assert not again.is_alive() and sampler.thread is None


def test_a_call_longer_than_its_interval_still_leaves_the_cell_time_between_calls():
    """A 3 ms reading at a 2 ms interval: the thread rests most of an interval after
    each call instead of calling back to back (holding the interpreter lock)."""
    sampler = SharedSampler(read=None, name="jupyter_gpumem-test")
    calls: list[float] = []

    def slow():
        calls.append(time.monotonic())
        t = time.perf_counter()
        while time.perf_counter() - t < 0.003:
            pass

    sampler.subscribe(slow, 0.002)
    try:
        time.sleep(0.4)
    finally:
        sampler.close(2.0)
    gaps = [b - a for a, b in zip(calls, calls[1:])]
    assert len(gaps) > 10 and min(gaps) >= 0.003 + 0.002 * 0.75, (len(gaps), min(gaps))


def test_a_thread_that_cannot_start_leaves_the_sampler_as_it_was(monkeypatch):
    """"can't start new thread": the subscription is refused, nothing half made stays, the
    next subscription starts a thread and closing works."""
    sampler = SharedSampler(read=None, name="jupyter_gpumem-test")
    real_start = threading.Thread.start

    def refuse(self):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", refuse)
    with pytest.raises(RuntimeError):
        sampler.subscribe(lambda: None, 0.01)
    monkeypatch.setattr(threading.Thread, "start", real_start)
    got: list[int] = []
    sub = sampler.subscribe(lambda: got.append(1), 0.01)
    try:
        deadline = time.monotonic() + 2.0
        while not got and time.monotonic() < deadline:
            time.sleep(0.01)
        assert got and sub.is_alive()
    finally:
        sampler.close(2.0)
    assert not sub.is_alive()
