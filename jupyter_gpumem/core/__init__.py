"""The core: names → scan → Snapshot, and names → purge plan → PurgeResult.

A few nouns: :mod:`.scan` (the walk from names to storages, roots, hidden holders,
paths), :mod:`.purge`, :mod:`.devices`, :mod:`.snapshot`, :mod:`.render`,
:mod:`.sampler` (the background sampling thread), :mod:`.cells` (IPython's cell
events paired, and the record of cell spans), :mod:`.trace` (the allocation
trace), :mod:`.processes` (the other processes on the GPUs, and orphans),
:mod:`.rescue` (out-of-memory errors, memory that creeps up on reruns),
:mod:`.fit` and :mod:`.files`. Nothing here imports IPython, widgets or a
framework at module level; the shell or the namespace is passed in.
"""
