"""The README's examples are true: its ``python`` blocks run, in order, as the cells of
a fresh IPython shell with the extension loaded (host tensors: the machine has no
GPU), and each ``text`` block that starts with a ``%gpumem`` line is that command's
output there: every line of it but the first (the device line, whose process figures
vary from machine to machine) appears in the real output, in the same order."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)

CHILD = r'''
import io, json, sys, contextlib
from IPython.core.interactiveshell import InteractiveShell
ip = InteractiveShell.instance()
ip.run_cell("%load_ext jupyter_gpumem", store_history=False)
out = []
for kind, code in json.loads(sys.argv[1]):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        r = ip.run_cell(code, store_history=True)
    if not r.success:
        raise SystemExit(f"cell failed: {code!r}: {r.error_in_exec or r.error_before_exec!r}")
    out.append(buf.getvalue())
print(json.dumps(out))
'''


def _blocks():
    return [(kind, body) for kind, body in BLOCK.findall(README.read_text())]


def _squash(line: str) -> str:
    return re.sub(r"\s+", " ", line.strip())


def test_the_readme_examples_run_and_print_what_it_shows():
    pytest.importorskip("torch")
    cells, expected = [], []
    for kind, body in _blocks():
        if kind == "python":
            cells.append(("python", body))
        elif kind == "text" and body.startswith("%gpumem"):
            first, _, shown = body.partition("\n")
            cells.append(("magic", first))
            expected.append((len(cells) - 1, first, shown))
    assert expected, "the README shows no %gpumem output any more: this test checks nothing"
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(cells)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    outputs = json.loads(done.stdout.strip().splitlines()[-1])
    for index, command, shown in expected:
        got = [_squash(line) for line in outputs[index].splitlines() if line.strip()]
        want = [_squash(line) for line in shown.splitlines()[1:] if line.strip()] \
            if not command.startswith("%gpumem purge") else \
            [_squash(line) for line in shown.splitlines() if line.strip()]
        if command == "%gpumem":       # the device line's figures vary; the rest is exact
            want = [_squash(line) for line in shown.splitlines()[1:] if line.strip()]
        at = 0
        for line in want:
            assert line in got[at:], (f"README, `{command}`: {line!r} is not in the output "
                                      f"(from line {at}):\n" + "\n".join(got))
            at = got.index(line, at) + 1
