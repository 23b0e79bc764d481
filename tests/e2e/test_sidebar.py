"""The "Kernel Memory" sidebar in a real browser against a real JupyterLab, and
in Jupyter Notebook 7's right panel.

The tests start the server on loopback (token, free port, stopped by pid),
serving the sidebar built from this working tree and running kernels that
import jupyter_gpumem from it. In Chromium (driven by Playwright, never a
downloaded browser):

- JupyterLab: open a notebook, run a cell that makes a 4 MiB host tensor,
  load the extension from the sidebar's button, check what the sidebar says
  on ``auto`` with no GPU, the host bar's segments, the timeline (uPlot: its
  canvas, the values under the cursor), that at the sidebar's default width
  names do not wrap, hints have their own row with code as code, and no
  header is cut; switch to ``cpu`` (the timeline keeps its history), purge
  through the confirmation dialog, prove with another cell that the name is
  gone from the kernel and that the old purge result goes with the next
  snapshot; restart the kernel.
- Notebook 7: the same sidebar opened in the right panel shows a running
  kernel's snapshot, with its default device from the JupyterLab settings.
- Replay: a recorded stream of the comm's messages (docs/sidebar-stream.json,
  made on a GPU by scripts/record_stream.py; else a CPU recording made here)
  is replayed from a real kernel into the sidebar for the README's picture.

Screenshots go to test-artifacts/ (ignored by git; GPUMEM_TEST_ARTIFACTS
names another folder), for a reviewer to look at; the tests never write into
the working tree's tracked files (docs/sidebar.png, the README's picture, is
updated by hand from test-artifacts/sidebar-replay.png, with the caption
that test writes beside it).

The browser tests are skipped only when Chromium is absent (the Notebook 7
one also when the ``notebook`` package is).
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lab_browser import (  # noqa: F401 - page: a fixture
    ARTIFACTS, ROOT, SIDEBAR, SIDEBAR_TAB, TOKEN, needs_chromium, page,
)
from lab_browser import notebook
from lab_browser import open_notebook
from lab_browser import accept_dialog
from lab_browser import run_cell as _run_cell
from lab_browser import screenshot_on_failure
from lab_browser import serve as _serve

SCREENSHOT = ARTIFACTS / "sidebar.png"

NOTEBOOK = notebook(
    "import torch\nbig = torch.ones(1024, 1024)",
    "'big' in dir(), 'small' in dir()",
    "small = torch.zeros(256, 1024)",
    "small2 = torch.zeros(512, 1024)\nsmall2[:2]",
)


@pytest.fixture
def lab(tmp_path):
    """A JupyterLab server on loopback serving this tree's sidebar; stopped by pid."""
    yield from _serve(tmp_path, "jupyterlab", {"demo.ipynb": NOTEBOOK})


def _widen_right_area(page, by: int = 160) -> None:
    """Drag the splitter left of the right area, so the screenshot shows a wide sidebar."""
    handle = page.locator("#jp-main-split-panel > .lm-SplitPanel-handle:not(.lm-mod-hidden)").last
    box = handle.bounding_box()
    if not box:
        return
    x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    page.mouse.move(x, y)
    page.mouse.down()
    page.mouse.move(x - by, y, steps=5)
    page.mouse.up()


def test_screenshots_go_to_an_ignored_folder_not_to_tracked_files():
    """The browser test's screenshots never show up in ``git status``."""
    git = shutil.which("git")
    if git is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    if os.environ.get("GPUMEM_TEST_ARTIFACTS"):
        pytest.skip("GPUMEM_TEST_ARTIFACTS names the folder: the caller's choice")
    for path in (SCREENSHOT, ARTIFACTS / "sidebar-failure.png"):
        rel = str(path.relative_to(ROOT))
        ignored = subprocess.run([git, "check-ignore", "-q", "--no-index", rel], cwd=ROOT)
        assert ignored.returncode == 0, f"{rel} is not ignored by git"
        tracked = subprocess.run([git, "ls-files", "--error-unmatch", rel], cwd=ROOT,
                                 capture_output=True)
        assert tracked.returncode != 0, f"{rel} is a tracked file"


@needs_chromium
def test_sidebar_lists_and_purges_a_host_tensor(lab, page):
    with screenshot_on_failure(page, "sidebar-failure.png"):
        _scenario(lab, page)


# What is wrong with the sidebar's layout at its width, as a list of lines.
LAYOUT_PROBLEMS = r"""
() => {
  const root = document.querySelector('#jupyter-gpumem-sidebar');
  const out = [];
  const cut = el => el.scrollWidth > el.clientWidth + 1;
  if (cut(root)) out.push(`sidebar overflows: ${root.scrollWidth} > ${root.clientWidth} px`);
  const kernel = root.querySelector('.jp-GpuMem-kernel');
  if (!kernel.title) out.push('kernel line has no title');
  if (getComputedStyle(kernel).textOverflow !== 'ellipsis') out.push('kernel line not ellipsized');
  for (const el of root.querySelectorAll('.jp-GpuMem-name')) {
    const lh = parseFloat(getComputedStyle(el).lineHeight) || 18;
    if (el.getBoundingClientRect().height > 1.5 * lh) out.push(`name wraps: ${el.textContent}`);
    if (getComputedStyle(el).whiteSpace !== 'nowrap') out.push(`name may wrap: ${el.textContent}`);
  }
  for (const th of root.querySelectorAll('.jp-GpuMem-holders th')) {
    if (cut(th)) out.push(`header cut: ${th.textContent}`);
  }
  const heads = [...root.querySelectorAll('.jp-GpuMem-holders thead th')]
    .filter(t => t.textContent && t.getClientRects().length);
  for (let i = 1; i < heads.length; i++) {
    const gap = heads[i].getBoundingClientRect().left - heads[i - 1].getBoundingClientRect().right;
    const a = heads[i - 1], ra = document.createRange(); ra.selectNodeContents(a);
    const b = heads[i], rb = document.createRange(); rb.selectNodeContents(b);
    const between = rb.getBoundingClientRect().left - ra.getBoundingClientRect().right;
    if (between < 8) out.push(`headers run together: ${a.textContent}|${b.textContent} (${between.toFixed(1)} px)`);
  }
  for (const code of root.querySelectorAll('.jp-GpuMem-hint code')) {
    // alone on a line: at a line's start with nothing after it
    const td = code.closest('td, .jp-GpuMem-hint');
    const left = td.getBoundingClientRect().left + parseFloat(getComputedStyle(td).paddingLeft);
    let rest = '';
    for (let n = code.nextSibling; n; n = n.nextSibling) rest += n.textContent;
    if (code.getBoundingClientRect().left - left < 2 && !/\w/.test(rest)) {
      out.push(`hint code alone on a line: ${code.textContent}`);
    }
  }
  if (/[\u{1F300}-\u{1FAFF}\u{2600}-\u{27BF}]/u.test(root.textContent)) out.push('an emoji in the sidebar');
  const sizes = new Set([...root.querySelectorAll('*')].filter(e => e.childNodes.length &&
    [...e.childNodes].some(n => n.nodeType === 3 && n.textContent.trim())).map(e => getComputedStyle(e).fontSize));
  if (sizes.size > 2) out.push(`type sizes: ${[...sizes].join(', ')}`);
  return out;
}
"""


# The widest run of cell-band pixels (a blue tint) across the middle of a chart, in CSS px.
BAND_WIDTH = r"""
id => {
  const canvas = document.querySelector(`#jupyter-gpumem-sidebar .jp-GpuMem-chartBox[data-device='${id}'] canvas`);
  const ctx = canvas.getContext('2d');
  const y = Math.round(canvas.height * 0.4);
  const row = ctx.getImageData(0, y, canvas.width, 1).data;
  let best = 0, run = 0;
  for (let x = 0; x < canvas.width; x++) {
    const [r, g, b, a] = row.slice(4 * x, 4 * x + 4);
    const band = a > 0 && b > r + 25 && g > r + 5;
    run = band ? run + 1 : 0;
    best = Math.max(best, run);
  }
  return best / (canvas.width / canvas.getBoundingClientRect().width);
}
"""


def _scenario(lab, page) -> None:
    timings = {}
    start = time.monotonic()
    open_notebook(page, lab['base'], "demo.ipynb")
    timings["lab open, kernel idle"] = time.monotonic() - start

    assert _run_cell(page, 0).strip() == ""

    # The sidebar: the kernel has not loaded the extension yet.
    page.click(SIDEBAR_TAB)
    sidebar = page.locator(SIDEBAR)
    load = sidebar.locator("button.jp-GpuMem-load")
    load.wait_for(timeout=30000)
    assert "has not loaded jupyter_gpumem" in sidebar.inner_text()
    t = time.monotonic()
    load.click()
    sidebar.locator("select").wait_for(timeout=30000)
    page.wait_for_function(
        "() => !document.querySelector('#jupyter-gpumem-sidebar .jp-GpuMem-load')"
        " && document.querySelector('#jupyter-gpumem-sidebar .jp-GpuMem-kernel')"
        ".textContent.includes('jupyter_gpumem 0.')",
        timeout=30000,
    )
    timings["load button to ready"] = time.monotonic() - t

    # No accelerator on this machine, device auto: the sidebar says plainly that
    # it shows the host, and shows it (no button to ask for what is there).
    notice = sidebar.locator(".jp-GpuMem-noAccelerator")
    notice.wait_for(timeout=30000)
    assert notice.inner_text() == "No GPU in this kernel: showing host memory and the tensors on it."
    assert sidebar.locator(".jp-GpuMem-useCpu").count() == 0
    assert "No accelerator in this kernel" not in sidebar.inner_text()
    assert sidebar.locator(".jp-GpuMem-title").inner_text().lower() == "host memory"
    row = sidebar.locator('tr.jp-GpuMem-holder[data-name="big"]')
    row.wait_for(timeout=30000)
    assert row.locator(".jp-GpuMem-bytes").first.inner_text() == "4.0 MiB"

    # The host bar draws its segments: the tensors found and the rest of the process.
    bar = sidebar.locator('.jp-GpuMem-device[data-device="cpu"] .jp-GpuMem-bar')
    bar.wait_for()
    page.wait_for_function(
        "() => document.querySelectorAll('#jupyter-gpumem-sidebar .jp-GpuMem-device[data-device=cpu]"
        " .jp-GpuMem-seg').length === 2", timeout=20000,
    )
    # read in one go in the page: the bar is drawn again at each device reading (about
    # once a second), so an element found by one call may be gone at the next
    drawn = page.evaluate(
        "() => Array.from(document.querySelectorAll('#jupyter-gpumem-sidebar "
        ".jp-GpuMem-device[data-device=cpu] .jp-GpuMem-seg')).map(e => "
        "[e.getAttribute('class'), e.getBoundingClientRect().width])")
    classes = [c for c, _ in drawn]
    assert classes == ["jp-GpuMem-seg jp-GpuMem-seg-allocated", "jp-GpuMem-seg jp-GpuMem-seg-non-framework"]
    widths = [w for _, w in drawn]
    assert all(w >= 3 for w in widths), widths

    # Device readings keep coming (about once a second): the timeline grows, drawn by uPlot.
    chart = sidebar.locator('.jp-GpuMem-chartBox[data-device="cpu"]')
    page.wait_for_function(
        "() => { const c = document.querySelector('#jupyter-gpumem-sidebar "
        ".jp-GpuMem-chartBox[data-device=cpu]'); return c && +c.dataset.points >= 4 "
        "&& c.querySelector('.uplot canvas'); }",
        timeout=20000,
    )
    legend = chart.locator(".u-legend")
    latest = legend.inner_text()
    assert "process" in latest and "MiB" in latest, latest
    over = chart.locator(".u-over")
    box = over.bounding_box()
    assert box["height"] >= 40 and box["width"] >= 100, box
    page.mouse.move(box["x"] + 2, box["y"] + box["height"] / 2)
    page.wait_for_function(
        "t => document.querySelector('#jupyter-gpumem-sidebar .jp-GpuMem-chartBox[data-device=cpu] "
        ".u-legend').innerText !== t", arg=latest, timeout=5000,
    )
    hovered = legend.inner_text()
    assert re.search(r"\d\d:\d\d:\d\d", hovered) and "MiB" in hovered, hovered
    page.mouse.move(10, 10)

    # A cell that runs pushes a fresh snapshot: no refresh needed; its band is on the timeline.
    assert _run_cell(page, 2).strip() == ""
    small = sidebar.locator('tr.jp-GpuMem-holder[data-name="small"]')
    small.wait_for(timeout=30000)
    assert small.locator(".jp-GpuMem-bytes").first.inner_text() == "1.0 MiB"
    assert int(chart.get_attribute("data-cells")) >= 1
    out = _run_cell(page, 3)
    assert "tensor" in out
    hint = sidebar.locator('.jp-GpuMem-hints .jp-GpuMem-hint', has_text="Out[")
    hint.wait_for(timeout=30000)
    assert hint.locator("code").last.inner_text() == ";"

    # At the sidebar's default width: it fits, names on one line, hints on their own lines.
    width = page.evaluate("() => document.querySelector('#jupyter-gpumem-sidebar').clientWidth")
    problems = page.evaluate(LAYOUT_PROBLEMS)
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOT))
    sidebar.screenshot(path=str(ARTIFACTS / "sidebar-panel.png"))
    assert problems == [], f"at {width} px: {problems}"
    assert 200 <= width <= 320, width
    scanned = sidebar.locator(".jp-GpuMem-scanned").inner_text()
    assert re.fullmatch(r"\d+ holders? · scanned at \d\d:\d\d:\d\d in (<1|\d+) ms|.* in \d+\.\d s", scanned), scanned

    # Another device selection keeps the timeline of the device (it does not restart).
    before = int(chart.get_attribute("data-points"))
    sidebar.locator("select").select_option("cpu")
    sidebar.locator('tr.jp-GpuMem-holder[data-name="big"]').wait_for(timeout=30000)
    assert int(chart.get_attribute("data-points")) >= before
    assert sidebar.locator(".jp-GpuMem-noAccelerator").count() == 0

    row.locator("input[type=checkbox]").check()
    purge = sidebar.locator("button.jp-GpuMem-purge")
    assert purge.inner_text().startswith("Purge selected (1)")

    t = time.monotonic()
    purge.click()
    accept_dialog(page, "big", "4.0 MiB", timeout=10000)
    result = sidebar.locator(".jp-GpuMem-purgeResult")
    result.wait_for(timeout=30000)
    assert "Removed: big" in result.inner_text()
    # the sidebar shows the snapshot after the purge
    row.wait_for(state="detached", timeout=30000)
    timings["purge click to row gone"] = time.monotonic() - t
    _widen_right_area(page)
    page.screenshot(path=str(ARTIFACTS / "sidebar-after-purge.png"))

    # The name is gone from the kernel; the other one is intact. The cell's
    # snapshot is newer than the purge: the old result goes.
    assert _run_cell(page, 1).strip() == "(False, True)"
    assert small.is_visible()
    result.wait_for(state="detached", timeout=30000)

    # After a kernel restart the extension is gone: the sidebar offers to load it.
    t = time.monotonic()
    page.locator(
        '.jp-NotebookPanel-toolbar [data-command="notebook:restart-kernel"]'
    ).click()
    page.locator(".jp-Dialog button.jp-mod-accept").click()
    load.wait_for(timeout=60000)
    assert small.count() == 0
    timings["restart to load button"] = time.monotonic() - t
    timings["total"] = time.monotonic() - start
    print("e2e timings (s): " + ", ".join(f"{k} {v:.1f}" for k, v in timings.items()))


def _notebook7() -> bool:
    try:
        import notebook
    except ImportError:
        return False
    return int(notebook.__version__.split(".")[0]) >= 7


@needs_chromium
@pytest.mark.skipif(not _notebook7(), reason="Jupyter Notebook 7 (pip package notebook) is not installed")
def test_sidebar_in_notebook7_right_panel(tmp_path, page):
    """Notebook 7 has no lab shell: the sidebar sits in its right panel and follows the notebook."""
    nb = notebook("%load_ext jupyter_gpumem\nimport torch\nbig = torch.ones(1024, 1024)")
    serve = contextlib.contextmanager(_serve)
    with serve(tmp_path / "server", "notebook", {"demo.ipynb": nb},
               user_settings={"defaultDevice": "cpu", "refreshInterval": 5}) as server:
        try:
            page.goto(f"{server['base']}/notebooks/demo.ipynb?token={TOKEN}")
            page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=90000)
            assert _run_cell(page, 0).strip() == ""
            # as a user opens it: View > Right Sidebar > Show Kernel Memory
            page.locator(".lm-MenuBar-item", has_text=re.compile(r"^View$")).click()
            page.locator(".lm-Menu-item", has_text="Right Sidebar").hover()
            page.locator(".lm-Menu-item", has_text="Show Kernel Memory").click()
            sidebar = page.locator(SIDEBAR)
            sidebar.wait_for(timeout=30000)
            row = sidebar.locator('tr.jp-GpuMem-holder[data-name="big"]')
            row.wait_for(timeout=60000)
            assert row.locator(".jp-GpuMem-bytes").first.inner_text() == "4.0 MiB"
            # the default device comes from the JupyterLab settings
            assert sidebar.locator("select").input_value() == "cpu"
            assert "demo.ipynb" in sidebar.locator(".jp-GpuMem-kernel").inner_text()
            # in the right panel, beside the notebook
            box = sidebar.bounding_box()
            assert box["x"] > page.viewport_size["width"] / 2, box
            assert page.evaluate(LAYOUT_PROBLEMS) == []
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "sidebar-notebook7.png"))
        except BaseException:
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "sidebar-notebook7-failure.png"))
            raise


RECORDED_STREAM = ROOT / "docs" / "sidebar-stream.json"
REPLAY_KERNEL = Path(__file__).with_name("replay_kernel.py")


def _stream_for_replay(tmp_path: Path) -> tuple[Path, str]:
    """The recorded GPU stream if there is one, else a CPU recording made now."""
    if RECORDED_STREAM.exists():
        stream = json.loads(RECORDED_STREAM.read_text())
        where = ", ".join(stream.get("gpus") or []) or stream.get("device")
        return RECORDED_STREAM, (
            f"The GPU Memory sidebar replaying a stream recorded on {where} "
            f"({stream.get('recorded_at')}, torch {stream['versions'].get('torch')}) "
            "by scripts/record_stream.py: a small model trained in a few cells."
        )
    out = tmp_path / "cpu-stream.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    subprocess.run([sys.executable, str(ROOT / "scripts" / "record_stream.py"), "--device", "cpu",
                    "--pause", "0.4", "--out", str(out)],
                   cwd=tmp_path, env=env, check=True, timeout=300, capture_output=True)
    return out, (
        "The GPU Memory sidebar replaying a CPU recording made by the test "
        "(docs/sidebar-stream.json, the GPU recording, is absent): host memory, not a GPU."
    )


@needs_chromium
def test_replay_of_a_recorded_stream_for_the_readme_picture(tmp_path, page):
    stream_path, caption = _stream_for_replay(tmp_path)
    stream = json.loads(stream_path.read_text())
    last = [m["data"]["snapshot"] for m in stream["messages"] if m["data"]["type"] == "snapshot"][-1]
    nb = notebook(f"import runpy\nrunpy.run_path({str(REPLAY_KERNEL)!r})['start']({str(stream_path)!r})")
    serve = contextlib.contextmanager(_serve)
    # a long name: the kernel line is cut with an ellipsis, its title has it all
    name = "replay-of-a-small-training-run-with-a-long-notebook-name.ipynb"
    with serve(tmp_path / "server", "jupyterlab", {name: nb}) as server:
        try:
            open_notebook(page, server['base'], f"{name}")
            page.click(SIDEBAR_TAB)
            sidebar = page.locator(SIDEBAR)
            sidebar.locator("button.jp-GpuMem-load").wait_for(timeout=30000)
            assert "replaying" in _run_cell(page, 0)
            for holder in last["holders"][:3]:
                sidebar.locator(f'tr.jp-GpuMem-holder[data-name="{holder["name"]}"]').wait_for(
                    timeout=30000)
            device = last["devices"][0]["id"]
            page.wait_for_function(
                "id => { const c = document.querySelector(`#jupyter-gpumem-sidebar "
                ".jp-GpuMem-chartBox[data-device='${id}']`); return c && +c.dataset.points >= 5 "
                "&& +c.dataset.cells >= 3 && c.querySelector('.uplot canvas'); }",
                arg=device, timeout=30000,
            )
            assert page.evaluate(LAYOUT_PROBLEMS) == []
            # cell bands are drawn, wider than a hairline
            assert page.evaluate(BAND_WIDTH, device) >= 4
            kernel = sidebar.locator(".jp-GpuMem-kernel")
            assert name in kernel.get_attribute("title")
            assert page.evaluate("() => { const k = document.querySelector("
                                 "'#jupyter-gpumem-sidebar .jp-GpuMem-kernel');"
                                 " return k.scrollWidth > k.clientWidth; }"), "the name fits: no cut shown"
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "sidebar-replay.png"))
            sidebar.screenshot(path=str(ARTIFACTS / "sidebar-replay-panel.png"))
            (ARTIFACTS / "sidebar-replay.txt").write_text(caption + "\n")
            print("replay caption: " + caption)
        except BaseException:
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "sidebar-replay-failure.png"))
            raise
