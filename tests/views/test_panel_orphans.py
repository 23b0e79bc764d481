"""The live panel's Orphans section (``%gpumem panel``): this user's orphans on the GPUs,
named from the snapshot's processes, and the button that ends the ones a kernel left
after a confirmation, with the code of ``%gpumem purge --orphans``.

A real IPython shell and the real panel widget; real processes (an orphan is a child
whose parent exited, so it was handed to init or a subreaper); only NVML's per-process
lists are faked (tests/helpers/fake_nvml, as in tests/core/processes/test_orphans.py). Every check of what was
ended is made on the processes themselves.
"""
from __future__ import annotations

import os
import time

import psutil
import pytest

pytest.importorskip("ipywidgets")

import gpu_holders as gh  # noqa: E402
from jupyter_gpumem.backends import nvml  # noqa: E402
from jupyter_gpumem.core.processes import orphans as core_orphans  # noqa: E402
from jupyter_gpumem.views import panel as panel_mod  # noqa: E402
from jupyter_gpumem.views import panel_orphans  # noqa: E402
from panel_driving import open_panel  # noqa: E402

MiB = gh.MiB
KERNEL_ENV = {"JPY_PARENT_PID": "999999", "JPY_SESSION_NAME": "old.ipynb"}


def alive(pid: int) -> bool:
    """The process runs (a zombie has ended: its memory is freed)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def run(sh, code: str):
    result = sh.run_cell(code, store_history=True)
    assert result.success, result.error_before_exec or result.error_in_exec
    return result


@pytest.fixture
def shell(ip):
    yield ip
    panel_mod.close(ip)


@pytest.fixture
def machine(fake_nvml):
    """One GPU shared by: an orphan a kernel left (1200 MiB), an orphan no kernel started
    (400 MiB), a child of this process with a kernel's environment (its parent is alive:
    300 MiB) and this process itself (the kernel: 500 MiB)."""
    path, dev, started = fake_nvml
    left = gh.orphan(dev, env=KERNEL_ENV)
    stray = gh.orphan(dev)
    child = gh.hold(dev, env=KERNEL_ENV)
    started += [left, stray, child.pid]
    gh.write_nvml(path, [(left, 1200 * MiB), (stray, 400 * MiB), (child.pid, 300 * MiB),
                         (os.getpid(), 500 * MiB)], base=100 * MiB)
    return path, dev, started, {"left": left, "stray": stray, "child": child.pid}


def test_the_orphans_are_listed_and_cancel_ends_nothing(shell, machine):
    path, dev, started, pids = machine
    panel = open_panel(shell, "")
    listed = panel.orphan_section.rows()
    assert [(o["pid"], o["purgeable"]) for o in listed] == [(pids["left"], True),
                                                           (pids["stray"], False)]
    assert listed[0]["bytes"] == 1200 * MiB and listed[0]["devices"] == {"cuda:0": 1200 * MiB}
    assert listed[0]["path"] == "old.ipynb" and "python" in listed[0]["command"]
    html = panel.orphan_section.list.value
    assert f"data-orphan='{pids['left']}' data-bytes='{1200 * MiB}'" in html
    assert f"data-orphan='{pids['stray']}' data-bytes='{400 * MiB}'" in html
    for never in (pids["child"], os.getpid()):     # parent alive; this kernel
        assert f"data-orphan='{never}'" not in html
    assert "1.2 GiB" in html and "left by a kernel of old.ipynb" in html
    assert panel.orphan_section.box.layout.display is None
    # right under the device bars
    children = list(panel.widget.children)
    assert children.index(panel.orphan_section.box) == children.index(panel.cluster_bars) + 1

    button = panel.orphan_section.button
    assert button.description == "End 1 orphan (1.2 GiB)"
    assert not button.disabled and button.button_style == "warning"
    button.click()
    assert panel.orphan_section.question.box.layout.display is None
    assert button.layout.display == "none"         # the question takes its place
    question = panel.orphan_section.question.text.value
    assert f"data-confirm-orphan='{pids['left']}'" in question and "1.2 GiB" in question
    assert listed[0]["command"].split()[0] in question and "SIGTERM, then SIGKILL" in question
    for never in (pids["stray"], pids["child"], os.getpid()):
        assert f"data-confirm-orphan='{never}'" not in question
    assert alive(pids["left"])                    # asking ends nothing

    panel.orphan_section.question.cancel.click()
    time.sleep(0.3)
    assert all(alive(p) for p in pids.values())
    assert panel.orphan_section.question.box.layout.display == "none"
    assert button.layout.display is None and not button.disabled
    assert "cancelled: no process was ended" in panel.orphan_section.status.value
    assert panel.orphan_section.result.value == ""
    assert [o["pid"] for o in panel.orphan_section.rows()] == [pids["left"], pids["stray"]]


def test_confirm_ends_the_kernels_orphan_and_shows_each_step(shell, machine):
    path, dev, started, pids = machine
    panel = open_panel(shell, "")
    shown = []
    panel.orphan_section.result.observe(lambda change: shown.append(change["new"]), "value")
    panel.orphan_section.button.click()
    panel.orphan_section.question.yes.click()

    assert not alive(pids["left"])
    assert alive(pids["stray"]) and alive(pids["child"])
    # each step was shown as it was reported, then the whole result
    running = [v for v in shown if "data-orphans-result='running'" in v]
    assert any(f"pid {pids['left']}  SIGTERM  sent" in v for v in running), running
    result = panel.orphan_section.result.value
    assert "data-orphans-result='done'" in result
    assert "ended 1 of 1 orphan(s) holding 1.2 GiB" in result
    assert f"pid {pids['left']}  SIGTERM  sent" in result
    assert f"pid {pids['left']}  SIGTERM  ended" in result
    # the GPU figures after: used before, after, freed
    before = fmt(100 + 1200 + 400 + 300 + 500)
    after = fmt(100 + 400 + 300 + 500)
    assert f"<td>cuda:0</td><td style='text-align:right'>{before}</td>" \
           f"<td style='text-align:right'>{after}</td>" \
           f"<td style='text-align:right'><b>1.2 GiB</b></td>" in result, result
    assert "ended 1 of 1 orphan(s) at" in panel.orphan_section.status.value
    # the panel read the processes again: what is left is the orphan no kernel started
    assert [o["pid"] for o in panel.orphan_section.rows()] == [pids["stray"]]
    assert panel.orphan_section.button.disabled and panel.orphan_section.button.description == "End orphans"
    assert panel.orphan_section.button.layout.display is None
    panel.orphan_section.button.click()                  # disabled in the browser; here: nothing
    assert panel.orphan_section.question.box.layout.display == "none"
    assert alive(pids["stray"]) and alive(pids["child"])


def fmt(mib: int) -> str:
    from jupyter_gpumem.units import fmt_bytes
    return fmt_bytes(mib * MiB)


def test_only_what_the_confirmation_named_is_ended(shell, machine):
    """An orphan that turns up between the question and the answer is left alone."""
    path, dev, started, pids = machine
    panel = open_panel(shell, "")
    panel.orphan_section.button.click()
    late = gh.orphan(dev, env=KERNEL_ENV)
    started.append(late)
    gh.write_nvml(path, [(pids["left"], 1200 * MiB), (late, 700 * MiB),
                         (pids["child"], 300 * MiB)], base=100 * MiB)
    assert f"data-confirm-orphan='{late}'" not in panel.orphan_section.question.text.value
    panel.orphan_section.question.yes.click()
    assert not alive(pids["left"]) and alive(late) and alive(pids["child"])
    result = panel.orphan_section.result.value
    assert f"left alone: pid {late}: not in the confirmation" in result
    assert [o["pid"] for o in panel.orphan_section.rows()] == [late]
    assert panel.orphan_section.button.description == "End 1 orphan (700.0 MiB)"


def test_a_non_orphan_is_never_offered_nor_ended(shell, fake_nvml):
    """A child whose parent (this kernel) lives, with a kernel's environment, and this
    kernel itself: listed by NVML, never an orphan to the panel."""
    path, dev, started = fake_nvml
    child = gh.hold(dev, env=KERNEL_ENV)
    grand_parent, grandchild = gh.parent_of_holder(dev, env=KERNEL_ENV)
    started += [child.pid, grand_parent.pid, grandchild]
    gh.write_nvml(path, [(child.pid, 300 * MiB), (grandchild, 200 * MiB),
                         (os.getpid(), 500 * MiB)])
    panel = open_panel(shell, "")
    assert panel.orphan_section.rows() == []
    assert "no orphan of this user holds GPU memory" in panel.orphan_section.list.value
    assert panel.orphan_section.button.layout.display == "none"     # no orphan: no button
    panel.orphan_section.button.click()          # even if it were clicked: nothing to end
    assert "nothing to end" in panel.orphan_section.status.value
    assert panel.orphan_section.question.box.layout.display == "none"
    assert alive(child.pid) and alive(grandchild) and alive(grand_parent.pid)


def test_without_nvml_the_panel_says_so_and_nothing_breaks(shell, fake_nvml, monkeypatch):
    monkeypatch.delenv("FAKE_NVML")            # the fake's "NVML Shared Library Not Found"
    monkeypatch.setattr(nvml, "_state", nvml._fresh_state())
    panel = open_panel(shell, "")
    assert panel.orphan_section.rows() == []
    line = panel.orphan_section.list.value
    assert "GPU figures need NVML (the NVIDIA driver); none here" in line
    assert nvml.status() and panel_orphans.esc(nvml.status()) not in line   # no raw error
    assert "NVML" in nvml.status() and "Error" not in line
    # no GPU to tell of: the section that speaks of GPUs is not shown
    assert panel.orphan_section.box.layout.display == "none"
    assert panel.orphan_section.button.layout.display == "none"
    panel.orphan_section.button.click()
    assert "nothing to end" in panel.orphan_section.status.value
    assert "Error" not in panel.status.value and "Error" not in panel.orphan_section.status.value


def test_no_orphans_section_for_the_host(shell, machine):
    path, dev, started, pids = machine
    panel = open_panel(shell, "--device cpu")
    assert panel.orphan_section.box.layout.display == "none" and panel.orphan_section.rows() == []
    run(shell, "%gpumem panel --device auto")
    assert panel.orphan_section.box.layout.display is None
    assert [o["pid"] for o in panel.orphan_section.rows()] == [pids["left"], pids["stray"]]


def test_a_failure_is_one_line_in_the_panel_and_ends_nothing(shell, machine, monkeypatch):
    path, dev, started, pids = machine
    panel = open_panel(shell, "")
    panel.orphan_section.button.click()

    def broken(**_kw):
        raise OSError("the process table could not be read")

    monkeypatch.setattr(core_orphans, "purge_orphans", broken)
    panel.orphan_section.question.yes.click()          # raises nothing out of the callback
    status = panel.orphan_section.status.value
    assert "ending the orphans failed: OSError: the process table could not be read" in status
    assert "\n" not in status
    assert all(alive(p) for p in pids.values())
    panel.orphan_section.button.click()                  # the dry run fails too: one line
    assert "OSError: the process table could not be read" in panel.orphan_section.status.value
    assert panel.orphan_section.question.box.layout.display == "none"
    assert all(alive(p) for p in pids.values())
