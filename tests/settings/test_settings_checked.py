"""Settings and arguments are checked where they enter: ``scan_time_limit`` finite and
positive, ``default_device`` one this process has (when set and at load); the script
API checks ``device`` and ``time_limit`` as the magics check theirs."""
from __future__ import annotations

import math

import pytest

import jupyter_gpumem
from jupyter_gpumem.core.devices import accelerators
from conftest import ipython_with_profile, run

torch = pytest.importorskip("torch")
no_gpu = pytest.mark.skipif(bool(accelerators()), reason="this machine has an accelerator")


def _magics(ip):
    return ip.magics_manager.registry["GpuMemMagics"]


@pytest.fixture
def settings(ip):
    m = _magics(ip)
    saved = m.scan_time_limit, m.default_device
    yield ip
    m.scan_time_limit, m.default_device = saved


@pytest.mark.parametrize("bad", ['float("nan")', 'float("inf")', "0", "-1"])
def test_scan_time_limit_refuses_what_would_never_cut_or_report(settings, capfd, bad):
    run(settings, "%config GpuMemMagics.scan_time_limit = 5")
    capfd.readouterr()
    run(settings, f"%config GpuMemMagics.scan_time_limit = {bad}")
    err = capfd.readouterr().err
    assert "scan_time_limit" in err and "above 0" in err and "keeps 5.0" in err, err
    assert _magics(settings).scan_time_limit == 5.0       # the old value kept
    assert len(err.strip().splitlines()) == 1


def test_scan_time_limit_takes_a_positive_number(settings):
    run(settings, "%config GpuMemMagics.scan_time_limit = 0.5")
    assert _magics(settings).scan_time_limit == 0.5


@no_gpu
def test_default_device_that_is_not_here_is_refused_when_set(settings, capfd):
    run(settings, "%config GpuMemMagics.default_device = 'cpu'")
    capfd.readouterr()
    run(settings, "%config GpuMemMagics.default_device = 'cuda:0'")
    err = capfd.readouterr().err
    assert "no device cuda:0 here" in err and "keeps 'cpu'" in err, err
    assert _magics(settings).default_device == "cpu"
    res = settings.run_cell("%gpumem", store_history=True)    # still works
    assert res.error_in_exec is None


@no_gpu
def test_default_device_that_is_not_here_is_refused_at_load(tmp_path):
    """``c.GpuMemMagics.default_device = 'cuda:0'`` in a profile: one line, and the
    extension keeps ``auto``; the other settings load."""
    out = ipython_with_profile(
        tmp_path, "c.InteractiveShellApp.extensions = ['jupyter_gpumem']\n"
        "c.GpuMemMagics.default_device = 'cuda:0'\nc.GpuMemMagics.scan_time_limit = 7\n",
        "m = get_ipython().find_magic('gpumem').__self__; "
        "print('SETTINGS', m.default_device, m.scan_time_limit)")
    assert "SETTINGS auto 7.0" in out.stdout, out.stdout + out.stderr
    assert "no device cuda:0 here" in out.stderr, out.stderr


@no_gpu
@pytest.mark.parametrize("call", ["snapshot", "purge", "watch"])
def test_script_api_checks_the_device_as_the_magic_does(call):
    t = torch.ones(10)
    ns = {"t": t}
    fn = getattr(jupyter_gpumem, call)
    with pytest.raises(ValueError, match="no device cuda:0 here"):
        if call == "purge":
            fn(["t"], namespace=ns, device="cuda:0")
        else:
            fn(namespace=ns, device="cuda:0")
    assert ns["t"] is t


@pytest.mark.parametrize("call", ["snapshot", "purge", "watch"])
@pytest.mark.parametrize("limit", [math.nan, math.inf, 0, -1])
def test_script_api_checks_the_time_limit(call, limit):
    t = torch.ones(10)
    ns = {"t": t}
    fn = getattr(jupyter_gpumem, call)
    with pytest.raises(ValueError, match="time_limit"):
        if call == "purge":
            fn(["t"], namespace=ns, device="cpu", time_limit=limit)
        else:
            fn(namespace=ns, device="cpu", time_limit=limit)
    assert ns["t"] is t


def test_script_api_takes_good_arguments():
    ns = {"t": torch.ones(10)}
    snap = jupyter_gpumem.snapshot(ns, device="cpu", time_limit=2)
    assert snap.holder("t") is not None
