"""``%%gpumem fit`` on a real CUDA device: a ResNet-style and a GPT-style training step.

Each runs twice: with part of the device already held by the notebook (a tensor that
leaves a few GiB free), then under ``torch.cuda.set_per_process_memory_fraction``. The
answer is checked against an exhaustive search of the same grid (every multiple of the
step up to four steps past the answer), the trials against a bisection's count, and the
device against its starting figure (allocated exactly as before; reserved, with the caches
emptied, within 2 MiB). Where PyTorch Lightning is installed, its batch-size finder
(``Tuner.scale_batch_size``, binary search, no margin) runs the same step on the same
model beside the fit: its answer, trials and time against the fit's. Each test prints its
figures (``-s``).
"""
from __future__ import annotations

import math
import time

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
pytest.importorskip("IPython", reason="IPython is not installed")

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="no CUDA device: %%gpumem fit's GPU path needs one")

MiB, GiB = 1 << 20, 1 << 30
DEV = "cuda:0"
ROOM = 3 * GiB          # what the held tensor (or the fraction) leaves for the step

MODELS = {
    "resnet": """
import torch, torch.nn as nn
class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.a = nn.Sequential(nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU(),
                               nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c))
    def forward(self, x):
        return torch.relu(x + self.a(x))
model = nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
                      Block(64), Block(64), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                      nn.Linear(64, 10)).to('cuda:0')
def step(n):
    x = torch.randn(n, 3, 64, 64, device='cuda:0')
    y = torch.randint(0, 10, (n,), device='cuda:0')
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
""",
    "gpt": """
import torch, torch.nn as nn
class GPT(nn.Module):
    def __init__(self, vocab=512, d=256, layers=4, ctx=256):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        layer = nn.TransformerEncoderLayer(d, 8, 4 * d, dropout=0.0, batch_first=True,
                                           norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers)
        self.head = nn.Linear(d, vocab)
    def forward(self, idx):
        t = idx.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=idx.device)
        h = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        return self.head(self.blocks(h, mask=mask, is_causal=True))
model = GPT().to('cuda:0')
def step(n):
    idx = torch.randint(0, 512, (n, 257), device='cuda:0')
    logits = model(idx[:, :-1])
    loss = nn.functional.cross_entropy(logits.reshape(-1, 512), idx[:, 1:].reshape(-1))
    loss.backward()
""",
}

EXHAUSTIVE = """
def exhaustive(sizes):
    out = []
    saved = [p.grad for p in model.parameters()]
    state = {k: v.clone() for k, v in model.state_dict().items()}
    for n in sizes:
        for p in model.parameters():
            p.grad = None
        try:
            step(n); torch.cuda.synchronize(); ok = True
        except torch.cuda.OutOfMemoryError:
            ok = False
        for p in model.parameters():
            p.grad = None
        # released as the fit releases between its trials (the cuBLAS workspaces too): near
        # the limit a convolution's workspace makes the answer depend on what was cached
        gc.collect(); torch._C._cuda_clearCublasWorkspaces(); torch.cuda.empty_cache()
        out.append(ok)
    for p, g in zip(model.parameters(), saved):
        p.grad = g
    model.load_state_dict(state)
    del state
    gc.collect(); torch.cuda.empty_cache()
    return out
"""


def run(sh, code: str):
    result = sh.run_cell(code, store_history=False)
    assert result.error_before_exec is None and result.error_in_exec is None, code
    return result


def _empty():
    import gc  # noqa: PLC0415 - local to the helper
    gc.collect()
    torch.cuda.synchronize()
    # the fit's release clears the cuBLAS workspaces (torch makes them again at the next
    # product): cleared here too, so that before and after count the user's tensors only
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()
    torch.cuda.empty_cache()


def _peak(ip, n: int) -> int:
    _empty()
    torch.cuda.reset_peak_memory_stats(0)
    start = torch.cuda.memory_allocated(0)
    run(ip, f"step({n})\nfor p in model.parameters():\n    p.grad = None\n")
    return torch.cuda.max_memory_allocated(0) - start


@pytest.fixture
def held(ip):
    yield ip
    run(ip, "globals().pop('held', None)\nglobals().pop('model', None)\nimport gc\ngc.collect()")
    torch.cuda.set_per_process_memory_fraction(1.0, 0)
    _empty()


@pytest.mark.parametrize("how", ["held", "fraction"])
@pytest.mark.parametrize("which", sorted(MODELS))
def test_fit_on_cuda_matches_an_exhaustive_search(held, which, how):
    ip = held
    run(ip, "import gc\n%load_ext jupyter_gpumem\n" + MODELS[which] + EXHAUSTIVE)
    # the grid: some 30 steps up to the answer, from two measured peaks
    small, big = _peak(ip, 8), _peak(ip, 32)
    per = max((big - small) / 24, 1)
    step = max(8, int((ROOM - small) / per / 30) // 8 * 8)
    top = step * 128
    run(ip, "step(4)\nbs = 'mine'\n")                       # gradients exist before
    grads = [(p.grad, p.grad.clone()) for p in ip.user_ns["model"].parameters()]
    _empty()
    free, total = torch.cuda.mem_get_info(0)
    if how == "held":
        run(ip, f"held = torch.empty({free - ROOM - 512 * MiB}, dtype=torch.uint8, device='cuda:0')")
    else:
        fraction = (torch.cuda.memory_allocated(0) + ROOM) / total
        torch.cuda.set_per_process_memory_fraction(fraction, 0)
    _empty()
    alloc0, reserved0 = torch.cuda.memory_allocated(0), torch.cuda.memory_reserved(0)
    used0 = total - torch.cuda.mem_get_info(0)[0]
    r = ip.run_cell_magic("gpumem", f"fit bs --step {step} --max {top} --device {DEV} -o res",
                          "step(bs)\n")
    _empty()
    alloc1, reserved1 = torch.cuda.memory_allocated(0), torch.cuda.memory_reserved(0)
    used1 = total - torch.cuda.mem_get_info(0)[0]
    print(f"\n[{which}, {how}] step {step}\n{r!r}\n"
          f"allocated {alloc0 / MiB:.1f} -> {alloc1 / MiB:.1f} MiB, reserved "
          f"{reserved0 / MiB:.1f} -> {reserved1 / MiB:.1f} MiB, device used "
          f"{used0 / MiB:.1f} -> {used1 / MiB:.1f} MiB")
    assert alloc1 == alloc0
    assert reserved1 <= reserved0 + 2 * MiB and used1 <= used0 + 2 * MiB
    assert ip.user_ns["bs"] == "mine" and "loss" not in ip.user_ns
    for p, (g, copy) in zip(ip.user_ns["model"].parameters(), grads):
        assert p.grad is g and torch.equal(p.grad, copy)
    assert r.largest is not None and r.largest < top, repr(r)
    sizes = list(range(step, r.largest + 4 * step + 1, step))
    oks = ip.user_ns["exhaustive"](sizes)
    best = max(s for s, ok in zip(sizes, oks) if ok)
    print(f"exhaustive: {best} ({sum(oks)} of {len(sizes)} sizes ran)")
    assert abs(best - r.largest) <= step, (repr(r), list(zip(sizes, oks)))
    assert len(r.trials) < math.ceil(math.log2(top // step + 1)), repr(r)
    _empty()
    assert torch.cuda.memory_allocated(0) == alloc0


LIGHTNING = '''
import pytorch_lightning as pl
from torch.utils.data import DataLoader

class Steps(pl.LightningModule):
    """The notebook's step(n) as a LightningModule: a batch of n indices runs step(n)
    (forward and backward, gradients dropped after), as the fit runs it, then a step of
    an optimizer that keeps no state and changes nothing (Lightning counts its trials'
    steps by the optimizer's)."""
    def __init__(self, net, batch_size):
        super().__init__()
        self.net, self.batch_size, self.tried = net, batch_size, []
        self.automatic_optimization = False
    def train_dataloader(self):
        return DataLoader(range(1 << 20), batch_size=self.batch_size)
    def training_step(self, batch, i):
        self.tried.append(len(batch))
        step(len(batch))
        self.optimizers().step()
        for p in self.net.parameters():
            p.grad = None
    def configure_optimizers(self):
        return torch.optim.SGD(self.net.parameters(), lr=0.0)
'''


@pytest.mark.parametrize("which", sorted(MODELS))
def test_fit_against_lightnings_batch_size_finder(held, which, tmp_path):
    pytest.importorskip("pytorch_lightning", reason="PyTorch Lightning is not installed")
    ip = held
    run(ip, "import gc\n%load_ext jupyter_gpumem\n" + MODELS[which] + EXHAUSTIVE + LIGHTNING)
    small, big = _peak(ip, 8), _peak(ip, 32)
    per = max((big - small) / 24, 1)
    step = max(8, int((ROOM - small) / per / 30) // 8 * 8)
    top = step * 128
    # no gradients before either search: Lightning's steps drop them, the fit puts them back
    run(ip, "for p in model.parameters():\n    p.grad = None\n")
    _empty()
    free, _total = torch.cuda.mem_get_info(0)
    run(ip, f"held = torch.empty({free - ROOM - 512 * MiB}, dtype=torch.uint8, device='cuda:0')")
    _empty()
    alloc0 = torch.cuda.memory_allocated(0)
    t = time.perf_counter()
    r = ip.run_cell_magic("gpumem", f"fit bs --step {step} --max {top} --device {DEV} -o res",
                          "step(bs)\n")
    fit_s = time.perf_counter() - t
    _empty()
    assert torch.cuda.memory_allocated(0) == alloc0 and r.largest is not None

    import logging  # noqa: PLC0415 - Lightning's info lines, quiet for this test only
    logging.getLogger("pytorch_lightning").setLevel(logging.WARNING)
    pl = ip.user_ns["pl"]
    module = ip.user_ns["Steps"](ip.user_ns["model"], step)
    trainer = pl.Trainer(accelerator="gpu", devices=1, max_epochs=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=str(tmp_path))
    t = time.perf_counter()
    found = pl.tuner.Tuner(trainer).scale_batch_size(
        module, mode="binsearch", init_val=step, steps_per_trial=1, max_trials=25,
        margin=0.0, max_val=top)
    pl_s = time.perf_counter() - t
    _empty()
    pl_trials = len(module.tried)
    alloc1 = torch.cuda.memory_allocated(0)
    print(f"\n[{which}, held] step {step}\n"
          f"%%gpumem fit: {r.largest} in {len(r.trials)} trials, {fit_s:.2f} s\n"
          f"Lightning's BatchSizeFinder (binsearch, margin 0): {found} in {pl_trials} trials "
          f"({sorted(set(module.tried))}), {pl_s:.2f} s; allocated after Lightning "
          f"{alloc1 - alloc0:+d} B")
    # Lightning's teardown leaves the model in host memory: back where the notebook had it
    ip.user_ns["model"].to(DEV)
    sizes = sorted({step * (found // step), r.largest, r.largest + step, found})
    oks = dict(zip(sizes, ip.user_ns["exhaustive"](sizes)))
    print(f"checked one at a time: {oks}")
    # checked in the fit's conditions, its answer runs and the next size does not; where
    # Lightning (whose trials keep the workspaces cached) answered a larger size of the
    # grid, that size does not run in those conditions either
    assert oks[r.largest] and not oks[r.largest + step], oks
    assert step * (found // step) <= r.largest or not oks[step * (found // step)], (oks, found)
    assert len(r.trials) < pl_trials, (r.trials, module.tried)
