"""Rule 9, the generator of cases: random namespaces in a real IPython shell (host
tensors, ``--device cpu``), mutated between scans, every method and hook of theirs a
trap; the invariants are tests/generated/checks.py's. Profiles and the features left
out while their breaches are open: tests/generated/conftest.py."""
from __future__ import annotations

import time

import pytest

pytest.importorskip("torch")

from hypothesis import given, settings  # noqa: E402

from .checks import cold_report, run_recipe  # noqa: E402
from .conftest import ALLOWED, COLD_EXAMPLES, LOG  # noqa: E402
from .strategies import recipes  # noqa: E402


@given(recipe=recipes(ALLOWED))
def test_generated_notebooks_keep_every_rule(ip, recipe):
    try:
        run_recipe(ip, recipe)
    except BaseException as err:
        first = str(err).splitlines()[0][:200] if str(err) else ""
        _log(f"fail {type(err).__name__} {first} {recipe!r}")
        raise
    _log(f"ok {len(recipe)}")


def _log(line: str) -> None:
    if LOG:
        with open(LOG, "a") as f:
            print(f"{time.time():.1f} {line}", file=f)


@settings(max_examples=COLD_EXAMPLES)
@given(recipe=recipes(ALLOWED, max_steps=6))
def test_the_warm_report_is_a_fresh_processs(ip, recipe):
    warm = run_recipe(ip, recipe, report_before_purge=True)
    assert cold_report(recipe) == warm
