"""The device selection is made once, where the user's text enters (the magics' parsing,
the script API), and the layers below take only that value: one parse and one listing
of the accelerators per command, counted on the real functions; a ``str`` below the
edge is a TypeError. ``cuda:0`` is NVML's device here (tests/fake_nvml: no GPU)."""
from __future__ import annotations

import pytest

from conftest import run
import jupyter_gpumem
from jupyter_gpumem.core import devices, purge as core_purge, snapshot


@pytest.fixture
def one_gpu(fake_nvml):
    """NVML (the file-driven fake of the shared ``fake_nvml`` fixture) sees one GPU:
    ``cuda:0``."""
    yield


@pytest.fixture
def counted(monkeypatch):
    """Calls of the one parse (``devices.select``) and of ``devices.accelerators``."""
    calls = {"select": 0, "accelerators": 0}
    for name in calls:
        real = getattr(devices, name)

        def wrapper(*args, _real=real, _name=name, **kwargs):
            calls[_name] += 1
            return _real(*args, **kwargs)
        monkeypatch.setattr(devices, name, wrapper)
    return calls


COMMANDS = ["--device cpu -o", "x --device cpu -o", "purge x --device cpu --dry-run -o",
            "purge x --device cpu -o", "purge --all --device cpu -o"]
GPU_COMMANDS = ["--device cuda:0 -o", "purge --device cuda:0 --dry-run -o",
                "purge --device cuda:0 -o"]


@pytest.mark.parametrize("line", COMMANDS)
def test_one_parse_and_one_listing_per_command(ip, counted, line):
    torch = pytest.importorskip("torch")
    run(ip, "import torch\nx = torch.ones(4096)\ny = torch.zeros(2048)")
    counted.update(select=0, accelerators=0)
    result = ip.run_line_magic("gpumem", line)
    assert result is not None
    assert counted == {"select": 1, "accelerators": 1}, line
    if isinstance(result, snapshot.Snapshot):
        assert [d.id for d in result.devices] == ["cpu"]
    del torch


@pytest.mark.parametrize("line", GPU_COMMANDS)
def test_one_parse_and_one_listing_with_a_gpu(ip, one_gpu, counted, line):
    assert [a.id for a in devices.accelerators()] == ["cuda:0"]
    counted.update(select=0, accelerators=0)
    result = ip.run_line_magic("gpumem", line)
    assert result is not None
    assert counted == {"select": 1, "accelerators": 1}, line


def test_the_script_api_parses_at_its_edge(counted):
    pytest.importorskip("torch")
    import torch
    namespace = {"t": torch.ones(1024)}
    snap = jupyter_gpumem.snapshot(namespace, device=" CPU ")
    assert counted == {"select": 1, "accelerators": 1}
    assert snap.device == "cpu" and [h.name for h in snap.holders] == ["t"]
    counted.update(select=0, accelerators=0)
    result = jupyter_gpumem.purge(["t"], namespace=namespace, device="cpu")
    assert counted == {"select": 1, "accelerators": 1}
    assert "t" not in namespace and result.removed


def test_below_the_edge_a_str_is_a_type_error(ip):
    selection = devices.select("cpu")
    with pytest.raises(TypeError, match="DeviceSelection"):
        snapshot.build(shell=ip, device="cpu")
    with pytest.raises(TypeError, match="DeviceSelection"):
        core_purge.purge((), shell=ip, device="cpu", dry_run=True)
    with pytest.raises(TypeError, match="DeviceSelection"):
        devices.read_devices("cpu")
    with pytest.raises(TypeError, match="DeviceSelection"):
        core_purge.PurgeContext(ip, None, "cpu", core_purge.Budget(1.0))
    assert snapshot.build(shell=ip, device=selection).device == "cpu"
    assert [d.id for d in devices.read_devices(selection)] == ["cpu"]


def test_a_selection_keeps_the_text_and_what_it_found(one_gpu):
    got = devices.select(" CUDA:00 ")
    assert (got.text, got.device, got.ids) == (" CUDA:00 ", "cuda:0", ("cuda:0",))
    assert [a.id for a in got.accelerators] == ["cuda:0"]
    assert devices.select("all").ids == ("cuda:0", "cpu")
    assert devices.select("cpu").ids == ("cpu",)
    with pytest.raises(ValueError, match=r"^no device cuda:3 here: this process sees cuda:0$"):
        devices.select("cuda:3")
    assert devices.select("cuda:3", present=False).ids == ("cuda:3",)
    with pytest.raises(ValueError, match="unknown device"):
        devices.select("cuda:１")


def test_without_a_gpu_the_errors_are_as_before(ip):
    from IPython.core.error import UsageError
    with pytest.raises(UsageError, match="no device cuda:0 here: this process sees no accelerator"):
        ip.run_line_magic("gpumem", "--device cuda:0 -o")
    with pytest.raises(ValueError, match="^device: no device cuda:0 here"):
        jupyter_gpumem.snapshot({}, device="cuda:0")


def test_a_bad_device_text_at_the_purge_funnel_is_refused_and_counts_no_purge(ip):
    """The views' device text reaches the session's purge as text: a bad one is a
    PurgeError (nothing deleted), and the session hears of no purge."""
    from jupyter_gpumem.core.purge import PurgeError
    from jupyter_gpumem.session import session_of

    ip.run_line_magic("load_ext", "jupyter_gpumem")
    ip.user_ns["keep"] = 1
    session = session_of(ip)
    before = session.purges
    with pytest.raises(PurgeError):
        session.purge(["keep"], device="no-such-device")
    assert session.purges == before and ip.user_ns["keep"] == 1
