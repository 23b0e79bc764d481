"""NVML calls and time per device read, for 1, 2, 4 and 8 GPUs (a fake NVML).

A "read" is one ``devices.read_devices_now("cuda")``: what the samplers of
``%%gpuwatch``, the panel and the sidebar do every 50 ms to 1 s. NVML is the
counting fake ``pynvml`` of ``tests/helpers/counting_nvml.py`` (alike H200s, this
process on every other one; tests/backends/test_nvml.py counts on it too), so this runs anywhere; the same count on the
real library is ``tests/gpu/test_nvml_gpu.py``. Three cases: no framework
imported (devices found by NVML only), torch (its devices carry UUIDs) and
torch with CuPy (whose backend asks where this process has a context).

Printed per case and GPU count: the calls of the first read (NVML started,
handles, UUIDs and names read), of a later read, the mean over one second of
reads every 50 ms (the list of graphics processes of a device without this
process's compute context is asked once a second), and the median time of
a read with the fake (the product's own Python cost: a real NVML call adds
its own, a few microseconds each).

The counts of the code before caching cannot be measured in the same run;
they are printed beside, as measured with this fake on that code.

Run: ``python benchmarks/nvml_calls.py [--reads 200]``; ``--check`` exits 1
when a later read makes more than 2 calls per GPU.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "helpers"))

GPUS = (1, 2, 4, 8)
# Calls per read (after the first) of the code before caching (nvml.py of e371099, which
# read handles, UUIDs and names on every call), measured with the same fake and cases.
BEFORE = {"nvml only": (14, 35, 101, 329), "torch": (13, 29, 73, 209),
          "torch + cupy": (21, 43, 99, 259)}


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def measure(n: int, scenario: str, reads: int) -> dict:
    import pytest

    import counting_nvml as fakes
    from jupyter_gpumem.core import devices
    from jupyter_gpumem.backends import nvml

    with pytest.MonkeyPatch.context() as mp:
        clock = Clock()
        mp.setattr(nvml, "_clock", clock)
        fake = fakes.install(mp, n, scenario)
        first = fakes.counted(fake, lambda: devices.read_devices_now("cuda"))[0]
        clock.now += 0.05
        later = fakes.counted(fake, lambda: devices.read_devices_now("cuda"))[0]
        per_second = []
        for _ in range(int(round(1 / 0.05))):
            clock.now += 0.05
            per_second.append(fakes.counted(fake, lambda: devices.read_devices_now("cuda"))[0])
        times = []
        for _ in range(reads):
            clock.now += 0.05
            t0 = time.perf_counter()
            devices.read_devices_now("cuda")
            times.append(time.perf_counter() - t0)
        return {"first": first, "later": later, "mean": statistics.mean(per_second),
                "us": statistics.median(times) * 1e6}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reads", type=int, default=200, help="reads timed per case")
    ap.add_argument("--check", action="store_true", help="exit 1 above 2 calls per GPU")
    args = ap.parse_args(argv)
    failed = False
    print("NVML calls per device read (a counting fake pynvml; a read = read_devices_now('cuda'))")
    print(f"{'case':<14}{'GPUs':>5}{'first':>7}{'later':>7}{'per GPU':>9}"
          f"{'mean/1s@50ms':>14}{'before':>8}{'us/read':>9}")
    for scenario, before in BEFORE.items():
        for n, old in zip(GPUS, before):
            m = measure(n, scenario, args.reads)
            failed |= m["later"] > 2 * n
            print(f"{scenario:<14}{n:>5}{m['first']:>7}{m['later']:>7}{m['later'] / n:>9.1f}"
                  f"{m['mean']:>14.2f}{old:>8}{m['us']:>9.1f}")
    print("first: the first read of the process (NVML started; count, handles, UUIDs, names). "
          "before: calls per read of the code before caching, same fake (not this run).")
    return 1 if failed and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
