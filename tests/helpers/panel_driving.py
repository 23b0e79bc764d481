"""The live panel driven in-process, as its tests drive it: opened by its magic in a real
shell, its table's rows read as a user sees them."""
from __future__ import annotations

from jupyter_gpumem.views import panel as panel_mod


def open_panel(sh, options: str = "--device cpu") -> panel_mod.Panel:
    """``%gpumem panel OPTIONS`` in the shell ``sh`` (the cell must succeed); the panel."""
    result = sh.run_cell(f"%gpumem panel {options}".strip(), store_history=True)
    assert result.success, result.error_before_exec or result.error_in_exec
    panel = panel_mod.current(sh)
    assert panel is not None
    return panel


def shown_rows(panel) -> list[str]:
    """Checkbox labels of the rows the table shows now."""
    children = panel.table.children[2:]
    return [children[i].description for i in range(0, len(children), 2)]


def purge_checked(panel, *names: str) -> None:
    """Tick ``names`` in the panel's table, click Purge, then the question's confirm."""
    for name in names:
        panel.checkbox(name).value = True
    panel.purge_button.click()
    panel.confirm_button.click()
