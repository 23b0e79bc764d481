"""``python -m jupyter_gpumem.cli``: the same as ``jupyter gpumem``."""
import sys

from . import main

if __name__ == "__main__":
    sys.exit(main())
