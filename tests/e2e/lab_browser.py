"""What the browser tests share: this tree's sidebar served by a real JupyterLab (or
Notebook 7) on loopback, a Chromium driven by Playwright (never a downloaded browser),
and running a notebook's cell from the page."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LABEXT_SRC = ROOT / "labextension"
LABEXT_BUILD = ROOT / "jupyter_gpumem" / "labextension"
# screenshots go to an ignored folder (.gitignore: test-artifacts/), never to docs/
ARTIFACTS = Path(os.environ.get("GPUMEM_TEST_ARTIFACTS") or ROOT / "test-artifacts")
CHROMIUM = os.environ.get("GPUMEM_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TOKEN = "gpumem-e2e-token"


def notebook(*sources: str) -> dict:
    """A notebook (nbformat 4.5, the Python 3 kernel) of one code cell per source."""
    return {
        "cells": [{"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
                   "source": s} for s in sources],
        "metadata": {"kernelspec": {"display_name": "Python 3 (ipykernel)",
                                    "language": "python", "name": "python3"},
                     "language_info": {"name": "python"}},
        "nbformat": 4, "nbformat_minor": 5,
    }
SIDEBAR_TAB = '.lm-TabBar-tab[data-id="jupyter-gpumem-sidebar"]'
SIDEBAR = "#jupyter-gpumem-sidebar"

needs_chromium = pytest.mark.skipif(
    not (os.path.exists(CHROMIUM) and os.access(CHROMIUM, os.X_OK)),
    reason=f"Chromium is not installed at {CHROMIUM} (apt-get install -y chromium)",
)

def newest_source_mtime() -> float:
    files = [p for d in ("src", "style", "schema") for p in (LABEXT_SRC / d).rglob("*") if p.is_file()]
    files.append(LABEXT_SRC / "package.json")
    return max(p.stat().st_mtime for p in files)


def ensure_frontend_built() -> None:
    """Build the sidebar from labextension/ when the build is missing or older."""
    built = LABEXT_BUILD / "static" / "style.js"
    if built.exists() and built.stat().st_mtime >= newest_source_mtime():
        return
    bindir = str(Path(sys.executable).parent)
    env = dict(os.environ, PATH=bindir + os.pathsep + os.environ.get("PATH", ""))
    jlpm = shutil.which("jlpm", path=env["PATH"])
    assert jlpm and shutil.which("node"), "the sidebar is not built and Node.js/jlpm are missing"
    if not (LABEXT_SRC / "node_modules").is_dir():
        subprocess.run([jlpm, "install"], cwd=LABEXT_SRC, env=env, check=True, timeout=600)
    subprocess.run([jlpm, "build:prod"], cwd=LABEXT_SRC, env=env, check=True, timeout=600)
    assert built.exists()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, proc: subprocess.Popen, log: Path, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"JupyterLab exited: {log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"JupyterLab did not answer in {timeout} s: {log.read_text()[-3000:]}")


def serve(tmp_path: Path, app: str, notebooks: dict[str, dict], user_settings: dict | None = None):
    """Start ``python -m <app>`` (jupyterlab or notebook) on loopback; yield its base URL."""
    ensure_frontend_built()
    data = tmp_path / "data"
    (data / "labextensions").mkdir(parents=True)
    (data / "labextensions" / "jupyter-gpumem").symlink_to(LABEXT_BUILD)
    settings_dir = tmp_path / "settings"
    settings = settings_dir / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    # no "official Jupyter news?" question (and no request for news)
    (settings / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')
    if user_settings is not None:
        mine = settings_dir / "jupyter-gpumem"
        mine.mkdir(parents=True)
        (mine / "sidebar.jupyterlab-settings").write_text(json.dumps(user_settings))
    root = tmp_path / "notebooks"
    root.mkdir()
    for name, nb in notebooks.items():
        (root / name).write_text(json.dumps(nb))
    port = free_port()
    bindir = str(Path(sys.executable).parent)
    env = dict(
        os.environ,
        JUPYTER_PATH=str(data),
        JUPYTER_CONFIG_DIR=str(tmp_path / "config"),
        JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"),
        IPYTHONDIR=str(tmp_path / "ipython"),
        PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        PATH=bindir + os.pathsep + os.environ.get("PATH", ""),
    )
    klass = "LabApp" if app == "jupyterlab" else "JupyterNotebookApp"
    log = tmp_path / f"{app}.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", app, "--allow-root", "--no-browser",
             "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
             "--ServerApp.port_retries=0", f"--IdentityProvider.token={TOKEN}",
             f"--ServerApp.root_dir={root}",
             # the settings API is the jupyterlab server extension's, in Notebook 7 too
             f"--LabApp.user_settings_dir={settings_dir}",
             f"--LabApp.workspaces_dir={tmp_path / 'workspaces'}"]
            + ([f"--{klass}.user_settings_dir={settings_dir}",
                f"--{klass}.workspaces_dir={tmp_path / 'workspaces'}"]
               if klass != "LabApp" else [])
            + (["--LabApp.news_url=None",
                "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
               if app == "jupyterlab" else []),
            cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT,
        )
    try:
        base = f"http://127.0.0.1:{port}"
        wait_ready(f"{base}/api/status?token={TOKEN}", proc, log)
        yield {"base": base, "log": log, "root": root}
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)


def open_notebook(page, base: str, name: str) -> None:
    """Open the notebook ``name`` of the server at ``base`` in JupyterLab; return once its
    cells are shown and its kernel is idle."""
    page.goto(f"{base}/lab/tree/{name}?token={TOKEN}")
    page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=90000)
    page.wait_for_selector(
        '.jp-NotebookPanel .jp-Notebook-ExecutionIndicator[data-status="idle"]', timeout=90000)


def accept_dialog(page, *expected: str, timeout: float = 30000) -> None:
    """Wait for JupyterLab's dialog, check that it says each of ``expected``, accept it."""
    dialog = page.locator(".jp-Dialog")
    dialog.wait_for(timeout=timeout)
    text = dialog.inner_text()
    for words in expected:
        assert words in text, text
    dialog.locator("button.jp-mod-accept").click()


@pytest.fixture
def page(tmp_path):
    os.environ.setdefault("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"),
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_FLAGS,
            viewport={"width": 1400, "height": 900},
        )
        try:
            yield context.new_page()
        finally:
            context.close()


def take_kernel_dialog(page) -> None:
    """JupyterLab at times asks for the kernel of a notebook that names one (its session
    starts late on a loaded machine), and the question covers the page: take the kernel
    it offers. Any other dialog is left alone."""
    dialog = page.locator(".jp-Dialog").first
    try:
        if dialog.count() and "kernel" in dialog.inner_text(timeout=2000).lower():
            dialog.locator("button.jp-mod-accept").click(timeout=5000)
            dialog.wait_for(state="detached", timeout=10000)
    except Exception:  # noqa: BLE001 - gone meanwhile: the click that follows tells
        return


def wait_text(page, selector: str, pattern: str, timeout: float = 30000,
              inner: bool = False) -> None:
    """Wait until the element ``selector`` exists and its text matches the regular
    expression ``pattern``. An element not drawn yet (a page just reloaded, a view
    still opening) is waited for, never read as ``null``: every wait on a view's text
    goes through here."""
    page.wait_for_function(
        "([sel, pat, inner]) => { const e = document.querySelector(sel);"
        " return !!e && new RegExp(pat).test(inner ? e.innerText : e.textContent); }",
        arg=[selector, pattern, inner], timeout=timeout)


def run_cell(page, index: int) -> str:
    """Run the notebook's cell ``index`` and return its output text.

    Right after a notebook opens, JupyterLab can drop a run request made
    while the kernel connection still settles (the prompt stays ``[ ]``):
    the request is then made again, up to three times.
    """
    cell = page.locator(".jp-NotebookPanel .jp-Notebook .jp-Cell").nth(index)
    prompt = cell.locator(".jp-InputPrompt")
    run = page.locator(
        '.jp-NotebookPanel-toolbar [data-command="notebook:run-cell-and-select-next"]'
    )
    for attempt in range(3):
        take_kernel_dialog(page)
        try:
            prompt.click(timeout=10000)  # selects the cell (command mode)
            run.click(timeout=10000)
            page.wait_for_function(
                "el => /\\[(\\*|\\d+)\\]/.test(el.textContent)",
                arg=prompt.element_handle(), timeout=10000,
            )
            break
        except Exception:  # noqa: BLE001 - not started: ask again
            if attempt == 2:
                raise
    page.wait_for_function(
        "el => /\\[\\d+\\]/.test(el.textContent)", arg=prompt.element_handle(), timeout=60000
    )
    return "\n".join(cell.locator(".jp-OutputArea-output").all_inner_texts())


@contextlib.contextmanager
def screenshot_on_failure(page, name: str):
    """On a failure inside, a screenshot ``name`` in the ignored artifacts folder, for a
    look at what went wrong."""
    try:
        yield
    except BaseException:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / name))
        raise
