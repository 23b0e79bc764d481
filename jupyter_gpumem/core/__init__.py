"""The core: names → scan → Snapshot, and names → purge plan → PurgeResult.

Devices, the walk from names to storages, paths, snapshots, purges, the cell
monitor and the allocation trace. Nothing here imports IPython, widgets or a
framework at module level; the shell or the namespace is passed in.
"""
