"""What a purge answers: its result, per device, and what still holds the memory.

:class:`PurgeResult` is the PurgeResult object of docs/PROTOCOL.md; its text and
HTML are :mod:`.render`'s. :class:`PurgeError` is bad input, found before
anything was deleted.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..render import purge_html, purge_text
from ...units import JsonFields, Report, json_field, minus, round6

PURGE_SCHEMA = "jupyter_gpumem.purge/1"
#: who holds memory that is still alive when no name and no module's global reaches it
UNNAMED = "something outside the notebook's names"


class PurgeError(ValueError):
    """Bad input to purge: nothing was deleted."""

    @classmethod
    def check(cls, errors: list[str]) -> None:
        """Raise one error for all of ``errors`` (found before anything is deleted)."""
        if errors:
            raise cls("; ".join(errors) + " (nothing was deleted)")


@dataclass
class Change(JsonFields):
    """One device before and after a purge (bytes, read with ``measure``)."""

    JSON_AFTER = {"freed": "after"}

    device: str
    measure: str
    before: int | None
    after: int | None

    @property
    def freed(self) -> int | None:
        return minus(self.before, self.after)


@dataclass
class DeviceChange(Change):
    """Memory of one device before and after a purge (and its allocator's figures)."""

    allocated_before: int | None = None
    allocated_after: int | None = None
    reserved_before: int | None = None
    reserved_after: int | None = None


@dataclass
class StillHeld(JsonFields):
    """Memory a purge meant to free that another holder still keeps alive."""

    by: str
    path: str | None
    nbytes: int = json_field(key="bytes")
    #: name (of the notebook) | library (a module's global) | unnamed; not in its JSON
    kind: str = json_field("name", leave_out=True)


@dataclass(repr=False)   # the repr is the text report (Report)
class PurgeResult(JsonFields, Report):
    """What a purge removed and what it freed, per device; its JSON: the PurgeResult
    object of docs/PROTOCOL.md."""

    schema = PURGE_SCHEMA
    JSON_AFTER = {"schema": None, "dry_run": "schema", "partial": "dry_run",
                  "before": "predicted",
                  "after": "before", "freed": "after"}

    names: list[str]
    removed: list[str]
    predicted: dict[str, int]
    changes: list[DeviceChange] = field(default_factory=list)
    still_held: list[StillHeld] = field(default_factory=list)
    dry_run: bool = False
    #: a scan of the purge did not read everything (the time limit, most often): what it
    #: says may be missing holders; a real purge cut before its plan was whole refuses
    partial: bool = False
    messages: list[str] = field(default_factory=list)
    seconds: float = json_field(0.0, convert=round6)

    @property
    def before(self) -> dict[str, int | None]:
        return {c.device: c.before for c in self.changes}

    @property
    def after(self) -> dict[str, int | None]:
        return {c.device: c.after for c in self.changes}

    @property
    def freed(self) -> dict[str, int | None]:
        return {c.device: c.freed for c in self.changes}

    _text = purge_text
    _html = purge_html

