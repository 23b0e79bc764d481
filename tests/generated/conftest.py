"""Hypothesis profiles of the generated cases, chosen by ``GPUMEM_HYPOTHESIS_PROFILE``:

- ``ci`` (the default): a bounded run in each CI pass (a few minutes on two cores), the
  same recipes each time;
- ``long``: 10,000 recipes, for a run on demand
  (``GPUMEM_HYPOTHESIS_PROFILE=long python -m pytest tests/generated/test_generated.py``).

Neither keeps an example database (``database=None``), and Hypothesis' other files go to
a temporary folder: nothing is written into the checkout. A failure prints its recipe;
paste it into test_found.py as a named test.

``KNOWN_OPEN``: recipe features (tests/generated/recipe.py: FEATURES) whose breaches are
known and being fixed; the generated runs leave them out, each has its named regression
test in test_found.py. Empty it as the fixes land (``GPUMEM_GENERATED_FEATURES=all``
draws every feature whatever it holds, ``=sparse,set_`` adds those).
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import tempfile

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.configuration import set_hypothesis_home_dir

from .recipe import FEATURES

# Hypothesis' own files (its cache of the constants it finds in the code) go to a
# temporary folder too, never into the checkout
set_hypothesis_home_dir(os.path.join(tempfile.gettempdir(), "jupyter_gpumem-hypothesis"))

_COMMON = dict(
    deadline=None,
    database=None,
    print_blob=True,
    # one real shell serves every example (it is made fresh by each, see checks.fresh)
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                           HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
# the CI run draws the same recipes each time (derandomize): a red CI names a change, not
# a lucky draw; the long profile draws afresh each run to look further
settings.register_profile("ci", max_examples=60, derandomize=True, **_COMMON)
# the long profile shrinks a failure but leaves out the explain phase: it traces every line
# of each shrinking run (sys.settrace, a third of the time of a shrink) for a note on
# which lines only the failing runs met; the shrunk recipe is what goes to test_found.py
settings.register_profile("long", max_examples=10_000, derandomize=False,
                          phases=[p for p in Phase if p is not Phase.explain], **_COMMON)
PROFILE = os.environ.get("GPUMEM_HYPOTHESIS_PROFILE", "ci")
settings.load_profile(PROFILE)

#: where each example's outcome is appended, one line each (to follow a long run)
LOG = os.environ.get("GPUMEM_GENERATED_LOG")

#: how many recipes are also run in a fresh process (slow: one interpreter each)
COLD_EXAMPLES = {"ci": 3, "long": 60}.get(PROFILE, 3)

KNOWN_OPEN: frozenset = frozenset()
_ASKED = os.environ.get("GPUMEM_GENERATED_FEATURES", "")
#: the features the generated runs draw from (``all``, or those of KNOWN_OPEN named,
#: comma-separated, on top of the rest)
ALLOWED = frozenset(FEATURES) if _ASKED == "all" else \
    frozenset(FEATURES) - KNOWN_OPEN | (set(_ASKED.split(",")) & set(FEATURES))


#: frameworks imported (where installed) before the first example: every backend of theirs
#: is then active in each scan, as in a process that imported them (a Keras hint once ran
#: ``isinstance`` on every holder, met only after another test file imported TensorFlow)
FRAMEWORKS = ("keras", "jax")


@pytest.fixture(scope="package", autouse=True)
def frozen_heap():
    """Every installed framework of :data:`FRAMEWORKS` imported, then the heap as it is
    before the first example moves to the collector's permanent generation
    (``gc.freeze``): each full collection (the examples' and the purge's) then walks what
    the examples made, not all of torch and IPython (a tenth of the time). Each example
    freezes again what lives at its start (checks.settle: the shell, the modules the
    earlier examples imported, Hypothesis' records). The shell is made here where no
    earlier test made it, its history's database in memory."""
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    from .checks import freeze_heap, unfreeze_heap  # (torch: where a test of it runs)

    if not InteractiveShell.initialized():
        # the shell the ``ip`` fixture takes (tests/conftest.py), its history's database in
        # memory: the same history (Out, In, _N) and sessions, none of the commits to a file
        # that each cell and each example's reset make (fsync'd, by a thread of its own)
        config = Config()
        config.HistoryManager.hist_file = ":memory:"
        InteractiveShell.instance(config=config)
    for name in FRAMEWORKS:
        if importlib.util.find_spec(name) is not None:
            importlib.import_module(name)
    freeze_heap()
    yield
    unfreeze_heap()
