"""``python -m jupyter_gpumem.cli``: the same as ``jupyter gpumem``."""
import sys

from . import main

sys.exit(main())
