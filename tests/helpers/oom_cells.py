"""The cells of a real host out-of-memory error, shared by the kernel test
(tests/core/rescue/test_oom.py) and the browser test (tests/e2e/test_rescue_browser.py): an
address-space limit set on the kernel, calibrated to its size (the kernel runs with
``MALLOC_ARENA_MAX=2``, so that only the cell's own allocation can fail)."""
from __future__ import annotations

MiB = 1 << 20
HELD = 350          # MiB shown in Out, and as much again in the failing traceback's frame
ASK = 1000          # MiB the failing cell asks for beside what it holds
HEADROOM = 1200     # MiB left under the limit: 350 + 1000 fails, and passes once 350 is freed

SETUP = f"""
import gc, resource, torch
other = torch.ones({8 * MiB}, dtype=torch.uint8)     # the user's own, never taken
torch.ones(4).sum()                                    # torch's threads exist before the limit
"""
SHOWN = f"torch.ones({HELD * MiB}, dtype=torch.uint8)"
LIMIT = f"""
def _vm():
    for line in open('/proc/self/status'):
        if line.startswith('VmSize'):
            return int(line.split()[1]) * 1024
resource.setrlimit(resource.RLIMIT_AS, (_vm() + {HEADROOM * MiB}, resource.getrlimit(resource.RLIMIT_AS)[1]))
"""
#: the failing traceback's own frame holds 350 MiB when the 1000 MiB request fails
IN_FRAME = f"""
def step():
    t = torch.ones({HELD * MiB}, dtype=torch.uint8)
    big = torch.empty({ASK * MiB}, dtype=torch.uint8)
    return int(t[0]) + big.numel()
done = step()
print('done', done)
"""
#: the 350 MiB are held by the exception the failing one was raised while handling
CHAINED = f"""
def load():
    t = torch.ones({HELD * MiB}, dtype=torch.uint8)
    raise KeyError('no such shard')
try:
    load()
except KeyError:
    big = torch.empty({ASK * MiB}, dtype=torch.uint8)
print('done', big.numel())
"""
