"""The sidebar's Kernels section in Chromium against a real JupyterLab with the server
extension: two real kernels of that server (one holding the stand-in device file with a
child, one that left an orphan by killing its child's parent), another user's process;
NVML's per-process lists faked (tests/fake_nvml/pynvml.py). The section lists the
notebooks largest first with their figures, and the orphans; "End orphans" (through its
confirmation dialog) ends the orphan and the section shows the GPU back; "Shut down"
(confirmed) shuts a kernel down. Screenshot: test-artifacts/sidebar-kernels.png (copied
by hand to docs/sidebar-kernels.png). Skipped when Chromium is absent.
"""
from __future__ import annotations

import contextlib
import json
import time
import urllib.request

import psutil
import pytest

import gpu_holders as gh
from jupyter_harness import ready, run
from gpu_holders import HOLD_AND_CHILD, ORPHANED
from test_sidebar import ARTIFACTS, SIDEBAR, SIDEBAR_TAB, TOKEN, _serve, needs_chromium, page  # noqa: F401

from jupyter_client import BlockingKernelClient

MiB, GiB = gh.MiB, gh.GiB
EMPTY = {"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


def _api(base: str, method: str, path: str, body=None):
    req = urllib.request.Request(f"{base}/{path}", method=method,
                                 data=None if body is None else json.dumps(body).encode())
    req.add_header("Authorization", f"token {TOKEN}")
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read() or b"null")


@needs_chromium
def test_kernels_section_lists_notebooks_and_ends_the_orphan(tmp_path, page, monkeypatch):
    nvml_file = tmp_path / "nvml.json"
    dev = gh.device_file(tmp_path)
    gh.write_nvml(nvml_file, [])
    monkeypatch.setenv("PYTHONPATH", gh.FAKE_NVML_DIR)
    monkeypatch.setenv("FAKE_NVML", str(nvml_file))
    monkeypatch.setenv("JUPYTER_GPUMEM_DEVICE_FILES", dev)
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "jupyter_server_config.json").write_text(
        json.dumps({"ServerApp": {"jpserver_extensions": {"jupyter_gpumem": True}}}))
    serve = contextlib.contextmanager(_serve)
    theirs = gh.another_users()
    orphan = None
    clients = []
    with serve(tmp_path, "jupyterlab", {"train.ipynb": EMPTY, "eval.ipynb": EMPTY}) as lab:
        try:
            base = lab["base"]
            pids = {}
            for path, code in (("train.ipynb", ORPHANED), ("eval.ipynb", HOLD_AND_CHILD)):
                s = _api(base, "POST", "api/sessions", {"path": path, "type": "notebook",
                                                        "kernel": {"name": "python3"}})
                c = BlockingKernelClient(connection_file=str(
                    tmp_path / "runtime" / f"kernel-{s['kernel']['id']}.json"))
                c.load_connection_file()
                c.start_channels(hb=False)
                ready(c)
                clients.append(c)
                pids[path] = tuple(map(int, run(c, code.format(dev=dev)).split()))
            (train, orphan), (evalk, child) = pids["train.ipynb"], pids["eval.ipynb"]
            gh.write_nvml(nvml_file, [(train, 2 * GiB), (evalk, GiB), (child, 300 * MiB),
                                      (orphan, 768 * MiB), (theirs.pid, 400 * MiB)],
                          base=10 * MiB)
            page.goto(f"{base}/lab?token={TOKEN}")
            page.click(SIDEBAR_TAB)
            sidebar = page.locator(SIDEBAR)
            rows = sidebar.locator(".jp-GpuMem-srvKernel")
            rows.nth(1).wait_for(timeout=60000)
            paths = rows.locator(".jp-GpuMem-srvKernelPath").all_inner_texts()
            assert paths == ["train.ipynb", "eval.ipynb"]
            assert rows.locator(".jp-GpuMem-srvKernelBytes").all_inner_texts() == [
                "2.0 GiB", "1.3 GiB"]
            assert f"pid {evalk} · 1 child(ren)" in rows.nth(1).inner_text()
            orphans = sidebar.locator(".jp-GpuMem-orphans")
            assert f"pid {orphan}" in orphans.inner_text()
            assert "orphan: left by a kernel of train.ipynb" in orphans.inner_text()
            assert "another user's (nobody)" in sidebar.locator(".jp-GpuMem-kernels").inner_text()
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "sidebar-kernels.png"))
            sidebar.screenshot(path=str(ARTIFACTS / "sidebar-kernels-panel.png"))

            sidebar.locator("button.jp-GpuMem-orphansEnd").click()
            dialog = page.locator(".jp-Dialog")
            dialog.wait_for(timeout=10000)
            assert f"pid {orphan}" in dialog.inner_text()
            dialog.locator("button.jp-mod-warn").click()
            status = sidebar.locator(".jp-GpuMem-kernelsStatus")
            page.wait_for_function("el => el.textContent.startsWith('Ended')",
                                   arg=status.element_handle(), timeout=30000)
            assert status.inner_text() == "Ended 1 of 1 orphan(s); the GPUs got 768.0 MiB back."
            assert not psutil.pid_exists(orphan) or \
                psutil.Process(orphan).status() == psutil.STATUS_ZOMBIE
            sidebar.locator(".jp-GpuMem-orphans").wait_for(state="detached", timeout=10000)
            assert theirs.poll() is None and psutil.pid_exists(child)

            # Purge hidden: through the eval kernel's own comm, confirmed
            evalc = clients[1]
            run(evalc, "%load_ext jupyter_gpumem\nimport torch")
            run(evalc, "torch.ones(1024, 1024)")             # Out[...] holds 4 MiB
            assert run(evalc, "print(len(Out))").strip() == "1"
            rows.nth(1).locator("button.jp-GpuMem-srvKernelPurge").click()
            dialog.wait_for(timeout=30000)
            assert "Out[" in dialog.inner_text()
            dialog.locator("button.jp-mod-warn").click()
            page.wait_for_function("el => el.textContent.startsWith('Purged')",
                                   arg=status.element_handle(), timeout=30000)
            assert status.inner_text() == "Purged Out[3]: freed cuda:0 0 B, cpu 4.0 MiB."
            assert run(evalc, "print(len(Out))").strip() == "0"

            rows.nth(1).locator("button.jp-GpuMem-srvKernelShutdown").click()
            dialog.wait_for(timeout=10000)
            assert "eval.ipynb" in dialog.inner_text()
            dialog.locator("button.jp-mod-warn").click()
            deadline = time.time() + 30
            while psutil.pid_exists(evalk) and time.time() < deadline:
                time.sleep(0.2)
            assert not psutil.pid_exists(evalk) or \
                psutil.Process(evalk).status() == psutil.STATUS_ZOMBIE
            page.wait_for_function(
                "() => document.querySelectorAll('.jp-GpuMem-srvKernel').length === 1",
                timeout=30000)
            page.screenshot(path=str(ARTIFACTS / "sidebar-kernels-after.png"))
        except BaseException:
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "sidebar-kernels-failure.png"))
            raise
        finally:
            for c in clients:
                c.stop_channels()
            theirs.kill()
            if orphan:
                gh.end(orphan)
