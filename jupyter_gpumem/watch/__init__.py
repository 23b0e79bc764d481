"""What a cell or a block did to memory: the scope model behind ``%%gpuwatch``,
``%gpumem watch on`` and ``jupyter_gpumem.watch()``.

- :mod:`.scope`: :class:`~.scope.Watch`, the per-shell history and timeline;
- :mod:`.peaks`: exact allocator peaks that stay right when scopes nest;
- :mod:`.holders`: per-holder storages kept up to date between cells;
- :mod:`.result`: :class:`~.result.WatchResult` (text, HTML, JSON);
- :mod:`.export`: CSV/JSON and TensorBoard export of the history.

The package attribute ``jupyter_gpumem.watch`` is the :func:`~.scope.watch`
function (the package binds it after importing this subpackage); this
subpackage is what ``import jupyter_gpumem.watch`` loads. Nothing here
imports IPython.
"""
