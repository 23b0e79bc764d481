"""``GET api/gpumem/metrics``: the kernels endpoint's figures in Prometheus' text format.

Written with ``prometheus_client`` from one answer of :func:`.readings.build` (the same
pass as the kernels endpoint's within a second), through a registry of its own per
scrape: nothing is kept between scrapes but the server's :class:`.readings.Readings`.
Every series is named ``jupyter_gpumem_*``; their list and labels:
docs/ARCHITECTURE.md#the-servers-metrics.
"""
from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

PREFIX = "jupyter_gpumem_"
CONTENT_TYPE = CONTENT_TYPE_LATEST
KERNEL_LABELS = ["kernel_id", "path", "kernel_name", "user"]


def _gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(PREFIX + name, doc, labels=labels)


def families(data: dict, seconds: float | None = None, passes: int | None = None) -> list:
    """The metric families of one kernels answer ``data``."""
    who = data.get("user") or ""
    dev_labels = ["device", "uuid", "name"]
    total = _gauge("device_total_bytes", "GPU memory of the device (NVML)", dev_labels)
    used = _gauge("device_used_bytes", "GPU memory in use on the device (NVML)", dev_labels)
    ours = _gauge("device_kernels_bytes", "GPU memory of this server's kernels and their "
                  "children on the device", ["device"])
    hidden = _gauge("hidden_processes", "NVML entries on the device without a pid named "
                    "here (another PID namespace)", ["device"])
    by_device: dict[str, int] = {}
    for d in data["devices"]:
        labels = [d["device"], d.get("uuid") or "", d.get("name") or ""]
        if d.get("total") is not None:
            total.add_metric(labels, d["total"])
        if d.get("used") is not None:
            used.add_metric(labels, d["used"])
        hidden.add_metric([d["device"]], d.get("hidden") or 0)
        by_device[d["device"]] = 0
    gpu = _gauge("kernel_gpu_bytes", "GPU memory of a kernel and its descendants",
                 KERNEL_LABELS + ["device"])
    host = _gauge("kernel_host_rss_bytes", "resident host memory of a kernel and its "
                  "descendants", KERNEL_LABELS)
    for k in data["kernels"]:
        labels = [k["id"], k.get("path") or "", k.get("name") or "", who]
        for dev in by_device:
            n = k["gpu"].get(dev, 0)
            gpu.add_metric(labels + [dev], n)
            by_device[dev] += n
        rss = (k.get("host") or {}).get("rss")
        if rss is not None:
            host.add_metric(labels, rss)
    for dev, n in by_device.items():
        ours.add_metric([dev], n)
    count = _gauge("kernels", "the server's running kernels", ["user"])
    count.add_metric([who], len(data["kernels"]))
    out = [total, used, ours, gpu, host, count, hidden]
    out += _processes(data["others"], list(by_device), who)
    flag = _gauge("gpu", "1 where NVML answers with a device, else 0", [])
    flag.add_metric([], 1 if data.get("gpu") else 0)
    out.append(flag)
    if seconds is not None:
        took = _gauge("reading_seconds", "seconds the last reading of NVML and the process "
                      "table took", [])
        took.add_metric([], seconds)
        out.append(took)
    if passes is not None:
        made = CounterMetricFamily(PREFIX + "readings", "readings of NVML and the process "
                                   "table made (one serves the asks of a second)")
        made.add_metric([], passes)
        out.append(made)
    return out


def _processes(others: list[dict], devices: list[str], who: str) -> list:
    """The orphans and the other processes, counted and summed per device and user (the
    server's user's orphans as 0 where there are none, so that a graph shows 0)."""
    orphans: dict[tuple, list[int]] = {(dev, who): [0, 0] for dev in devices}
    rest: dict[tuple, list[int]] = {}
    for p in others:
        user = p.get("user") or ""
        if p["relation"] == "orphan":
            cell = orphans.setdefault((p["device"], user), [0, 0])
        else:
            cell = rest.setdefault((p["device"], user, p["relation"]), [0, 0])
        cell[0] += 1
        cell[1] += p.get("bytes") or 0
    o_n = _gauge("orphan_processes", "orphaned processes on the device (their parent gone)",
                 ["device", "user"])
    o_b = _gauge("orphan_bytes", "GPU memory of the orphaned processes", ["device", "user"])
    r_n = _gauge("other_processes", "other processes on the device: no kernel of this "
                 "server, no orphan", ["device", "user", "relation"])
    r_b = _gauge("other_bytes", "GPU memory of the other processes",
                 ["device", "user", "relation"])
    for key, (n, b) in sorted(orphans.items()):
        o_n.add_metric(list(key), n)
        o_b.add_metric(list(key), b)
    for key, (n, b) in sorted(rest.items()):
        r_n.add_metric(list(key), n)
        r_b.add_metric(list(key), b)
    return [o_n, o_b, r_n, r_b]


class _Scrape:
    def __init__(self, metrics: list):
        self.metrics = metrics

    def collect(self):
        return iter(self.metrics)


def text(data: dict, seconds: float | None = None, passes: int | None = None) -> bytes:
    """The exposition text of one kernels answer (a registry of its own, then dropped)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Scrape(families(data, seconds, passes)))
    return generate_latest(registry)
