"""What a cell or a block did to memory: the scope model behind ``%%gpuwatch``,
``%gpumem watch on`` and ``jupyter_gpumem.watch()``.

:mod:`.scope` (:class:`~.scope.Watch`, :func:`~.scope.watch`), :mod:`.state` (a shell's
history and timeline), :mod:`.sampling`, :mod:`.peaks`, :mod:`.holders`, :mod:`.frames`,
:mod:`.result` (:class:`~.result.WatchResult`), :mod:`.export`, :mod:`.rescue` and
:mod:`.reruns`. ``jupyter_gpumem.watch`` is two things: the package attribute is the
function :func:`~.scope.watch` (the package binds it after importing this subpackage),
and this subpackage is what ``import jupyter_gpumem.watch`` loads. Nothing here imports
IPython. See docs/ARCHITECTURE.md#the-modules-layer-by-layer.
"""
