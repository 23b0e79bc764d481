"""Writing a file never blocks and never writes through: every ``--save`` and
``--tensorboard`` goes to a new path or over a regular file, through a temporary file
beside it renamed into place; a FIFO, a symlink, a directory, a device or a missing
folder is a one-line UsageError, returned at once."""
from __future__ import annotations

import os
import threading

import pytest
from IPython.core.error import UsageError

from conftest import run

torch = pytest.importorskip("torch")
pytest.importorskip("matplotlib")

from jupyter_gpumem.core import files  # noqa: E402
from jupyter_gpumem.watch.export import summary_writer  # noqa: E402

SAVES = {
    "history-csv": ("%gpumem history --save {p}", ".csv"),
    "history-json": ("%gpumem history --save {p}", ".json"),
    "plot": ("%gpumem plot --save {p}", ".png"),
    "trace": ("%gpumem trace --save {p}", ".pickle"),
}


@pytest.fixture
def recorded(ip):
    """A shell with a watched cell (for history and plot) and host tracing on."""
    import matplotlib

    matplotlib.use("Agg")
    run(ip, "import torch")
    run(ip, "%%gpuwatch --device cpu\nk = torch.ones(1000)")
    run(ip, "%gpumem trace on --device cpu")
    run(ip, "k2 = torch.ones(2000)")
    yield ip
    run(ip, "%gpumem trace off")


def _cell_error(ip, cell: str, timeout: float = 20.0):
    """Run ``cell``; its error (None when it ran clean). Fails, rather than hangs, when
    the cell does not return within ``timeout``."""
    box = {}
    th = threading.Thread(target=lambda: box.setdefault("r", ip.run_cell(cell)), daemon=True)
    th.start()
    th.join(timeout)
    if th.is_alive():
        pytest.fail(f"{cell!r} blocked the kernel for {timeout} s")
    return box["r"].error_in_exec


def _release_fifo_later(path, seconds: float):
    """Open the FIFO's reading end after ``seconds``, so that a blocked writer returns."""
    def drain():
        import time

        time.sleep(seconds)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            while os.read(fd, 1 << 16):
                pass
        except BlockingIOError:
            pass
        os.close(fd)
    threading.Thread(target=drain, daemon=True).start()


@pytest.mark.parametrize("what", sorted(SAVES))
def test_a_fifo_is_refused_at_once(recorded, tmp_path, what):
    cell, ext = SAVES[what]
    fifo = tmp_path / f"x{ext}"
    os.mkfifo(fifo)
    _release_fifo_later(fifo, 15.0)     # so that a failing run ends; the check is the time
    err = _cell_error(recorded, cell.format(p=fifo), timeout=10.0)
    assert isinstance(err, UsageError), err
    assert "FIFO" in str(err) and "\n" not in str(err)
    import stat

    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


@pytest.mark.parametrize("what", sorted(SAVES))
def test_a_symlinks_target_is_untouched(recorded, tmp_path, what):
    cell, ext = SAVES[what]
    target = tmp_path / f"precious{ext}"
    target.write_bytes(b"mine")
    link = tmp_path / f"link{ext}"
    link.symlink_to(target)
    err = _cell_error(recorded, cell.format(p=link))
    assert isinstance(err, UsageError) and "symlink" in str(err), err
    assert target.read_bytes() == b"mine" and link.is_symlink()


@pytest.mark.parametrize("what", sorted(SAVES))
def test_a_directory_or_a_missing_folder_is_a_usage_error(recorded, tmp_path, what):
    cell, ext = SAVES[what]
    folder = tmp_path / f"dir{ext}"
    folder.mkdir()
    err = _cell_error(recorded, cell.format(p=folder))
    assert isinstance(err, UsageError) and "directory" in str(err), err
    err = _cell_error(recorded, cell.format(p=tmp_path / "nowhere" / f"x{ext}"))
    assert isinstance(err, UsageError) and "no such folder" in str(err), err
    assert sorted(p.name for p in tmp_path.iterdir()) == [folder.name]


@pytest.mark.parametrize("what", sorted(SAVES))
def test_a_good_save_replaces_a_regular_file_whole(recorded, tmp_path, what):
    cell, ext = SAVES[what]
    path = tmp_path / f"out{ext}"
    path.write_bytes(b"old")
    os.chmod(path, 0o600)
    assert _cell_error(recorded, cell.format(p=path)) is None
    data = path.read_bytes()
    assert data != b"old" and len(data) > 10
    assert (os.stat(path).st_mode & 0o777) == 0o600          # the file's own mode kept
    assert [p.name for p in tmp_path.iterdir()] == [path.name]   # no temporary left


def test_a_failed_write_leaves_the_old_file_and_no_partial_one(tmp_path):
    path = tmp_path / "out.csv"
    path.write_text("old")

    def write(f):
        f.write("half of it")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        files.write_file(str(path), write, text=True)
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.csv"]


def test_the_temporary_file_is_never_an_existing_one(tmp_path, monkeypatch):
    """O_EXCL|O_NOFOLLOW: a link planted where the temporary file goes is not followed."""
    victim = tmp_path / "victim"
    victim.write_text("safe")
    monkeypatch.setattr(files.os, "urandom", lambda n: b"\0" * n)
    path = tmp_path / "out.json"
    planted = tmp_path / f".out.json.{os.getpid()}.{'00' * 4}.tmp"
    planted.symlink_to(victim)
    with pytest.raises(OSError):
        files.write_file(str(path), lambda f: f.write(b"x"))
    assert victim.read_text() == "safe" and not path.exists()


def test_tensorboard_dir_must_be_a_real_directory_or_new(recorded, tmp_path):
    """Checked before the writer is looked for: the same with TensorBoard or without."""
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "linked"
    link.symlink_to(real)
    err = _cell_error(recorded, f"%gpumem history --tensorboard {link}")
    assert isinstance(err, UsageError) and "symlink" in str(err), err
    assert list(real.iterdir()) == []
    afile = tmp_path / "afile"
    afile.write_text("x")
    err = _cell_error(recorded, f"%gpumem history --tensorboard {afile}")
    assert isinstance(err, UsageError) and afile.read_text() == "x"
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    err = _cell_error(recorded, f"%gpumem history --tensorboard {fifo}", timeout=10.0)
    assert isinstance(err, UsageError) and "FIFO" in str(err)
    try:
        summary_writer(str(tmp_path / "probe")).close()
    except ImportError:
        pytest.skip("no TensorBoard writer installed: the refusals were checked")
    assert _cell_error(recorded, f"%gpumem history --tensorboard {tmp_path / 'new'}") is None
    assert list((tmp_path / "new").iterdir())


def test_check_file_says_what_the_path_is(tmp_path):
    assert files.check_file(str(tmp_path / "new.csv")) == str(tmp_path / "new.csv")
    with pytest.raises(files.Refused, match="device"):
        files.check_file("/dev/null")
    with pytest.raises(files.Refused, match="directory"):
        files.check_file(str(tmp_path))
