"""What the open watches gather from a sampling thread: the process's peak per device.

A :class:`SamplerHub` serves the open watches of one sampling thread through one
subscription to it: the session's (:attr:`Session.sampler`, shared with the panel and
the sidebar) for the watches of a shell with the extension loaded, whose hub its watch
state owns; :data:`PROCESS_SAMPLER` for a watch outside any session (a script's
``jupyter_gpumem.watch()``), which makes a hub of its own. Each open watch is one
:class:`Sampling`. The thread reads counters only.
"""
from __future__ import annotations

import threading
import time
from typing import Any

from ..core import devices as _devices
from ..core import sampler as _sampler
from .peaks import LEDGER

#: the sampling thread of watches outside a shell's session (a script's ``watch()``,
#: a shell without the extension): per process, since such a watch has no session to
#: own one; its thread runs only while one of them is open
PROCESS_SAMPLER = _sampler.SharedSampler(read=_devices.read_devices_now, name="jupyter_gpumem-watch")


def ordered(ids) -> list[str]:
    """Device ids once each, accelerators first, the host last."""
    return sorted(set(ids), key=lambda d: (d == "cpu", d))


def read_devices(ids: list[str], read: Any = None) -> dict[str, _devices.DeviceUsage]:
    """Device figures for these ids (counters only; never creates a CUDA context);
    ``read(selection)``, a sampler's shared reading, where given."""
    selection = "cpu" if list(ids) == ["cpu"] else "all"
    wanted = set(ids)
    usages = (read(selection) if read is not None
              else _devices.read_devices_now(selection, detail=False))
    return {d.id: d for d in usages if d.id in wanted}


class Sampling:
    """What one open watch gathers from the sampler: max process usage per device."""

    def __init__(self, device_ids: list[str], series: _sampler.Series, interval: float) -> None:
        self.devices = set(device_ids)
        self.series = series
        self.interval = interval
        self.max_process: dict[str, int] = {}
        self.samples: dict[str, int] = {}
        self.failure: str | None = None     # why the sampling thread stopped while this was open

    def observe(self, point: dict) -> None:
        for dev in self.devices:
            value = (point.get(dev) or {}).get("used_process")
            if value is None:
                continue
            self.samples[dev] = self.samples.get(dev, 0) + 1
            if value > self.max_process.get(dev, -1):
                self.max_process[dev] = value


class SamplerHub:
    """Every open watch's sampling on one sampling thread, through one subscription.

    The subscription is called while a watch is open (at the smallest interval of
    those open); ``hold()`` (the ``watch on`` footer) keeps it between cells, where its
    first tick with no watch open pauses it (a cell that starts before, run-all, finds
    it running); without holders it ends with the last watch. Should it end on its own,
    the open watches say so in their reports (``failure``) and the next watch subscribes
    again. It reads counters only.
    """

    def __init__(self, sampler: _sampler.SharedSampler) -> None:
        self.sampler = sampler
        self._lock = threading.Lock()
        #: the subscription to the sampler while one runs (or is paused between cells)
        self.sub: _sampler.Subscription | None = None
        #: the watches open now
        self.open: list[Sampling] = []
        self._holds = 0
        #: why the last subscription ended on its own; None once a new one runs
        self.failure: str | None = None

    def add(self, sampling: Sampling, usages: dict | None = None,
            point: dict | None = None) -> None:
        """Open ``sampling``; its first sample is ``usages`` where the caller has just read
        the devices (a watch's start), else a reading now; or ``point``, a sample the
        timeline has already (the last watch's end, which this one starts from)."""
        with self._lock:
            self.open.append(sampling)
            interval = sampling.interval if len(self.open) == 1 else \
                min(s.interval for s in self.open)
            sub = self.sub
            if sub is None or sub.stopped:
                self.sub = self.sampler.subscribe(self._tick, interval, name="watch",
                                                  on_failure=self._failed)
                self.failure = None
            else:
                if sub.interval != interval:
                    sub.interval = interval
                sub.resume()
        if point is not None:
            sampling.observe(point)
        else:
            self.sample([sampling], usages)

    def remove(self, sampling: Sampling, usages: dict | None = None) -> dict | None:
        """Close ``sampling`` after a last sample (``usages``, as for :meth:`add`); that
        sample's point."""
        try:
            return self.sample([sampling], usages)
        finally:
            self._drop(sampling)

    def _drop(self, sampling: Sampling) -> None:
        with self._lock:
            if sampling in self.open:
                self.open.remove(sampling)
            if self.open:
                return
            sub = self.sub
            if self._holds and sub is not None and not sub.stopped:
                # kept for the footer's next cell: its next tick, finding no watch open,
                # pauses it (so a cell that follows at once, run-all, resumes nothing)
                return
            self.sub = None
        if sub is not None:
            sub.stop()

    def hold(self) -> None:
        with self._lock:
            self._holds += 1

    def release(self) -> None:
        stop = None
        with self._lock:
            self._holds = max(self._holds - 1, 0)
            if not self._holds and not self.open:
                stop, self.sub = self.sub, None
        if stop is not None:
            stop.stop()

    def close(self) -> None:
        """End the subscription, held or not (its owner goes)."""
        with self._lock:
            self._holds = 0
            stop, self.sub = self.sub, None
            self.open.clear()
        if stop is not None:
            stop.stop()

    def _failed(self, failure: str) -> None:
        """In the sampling thread as the subscription ends: tell the open watches (never
        print)."""
        with self._lock:
            self.failure = failure
            for s in self.open:
                s.failure = failure

    def _tick(self) -> None:
        with self._lock:
            opens = list(self.open)
            if not opens:
                sub = self.sub
                if sub is not None:
                    sub.pause()     # between cells: until the next watch resumes it
                return
        self.sample(opens, read=self.sampler.read)
        LEDGER.tick()

    @staticmethod
    def sample(opens: list[Sampling], usages: dict | None = None,
               read: Any = None) -> dict:
        ids = sorted(set().union(*(s.devices for s in opens)))
        if usages is None or not set(ids) <= set(usages):
            usages = read_devices(ids, read)
        else:
            usages = {d: usages[d] for d in ids}
        t = time.time()
        point = _sampler.device_point(usages.values())
        seen: set[int] = set()
        for s in opens:
            s.observe(point)
            if id(s.series) not in seen:
                seen.add(id(s.series))
                s.series.append(t, {d: v for d, v in point.items()})
        return point
