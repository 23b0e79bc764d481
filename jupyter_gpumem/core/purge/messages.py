"""The lines a purge's result says: what was skipped, what a list keeps, who still
holds the memory, what a cut-short scan may have missed."""
from __future__ import annotations

from .result import UNNAMED, StillHeld
from ..render import fmt_bytes

#: more names than this holding the same bytes read as one line
GROUP_AT = 3


def cut_short(scan_result) -> str:
    """What to add to "holds no memory" when the scan that found nothing was cut."""
    if not scan_result.partial:
        return ""
    return (" that the scan found before it was cut short (" + ", ".join(scan_result.reasons)
            + "): it may hold more; a larger scan_time_limit looks further")



def partial_message(reasons: list[str]) -> str:
    """What a purge whose scans were cut says (its result is ``partial``)."""
    hint = " (raise GpuMemMagics.scan_time_limit)" if any("time limit" in r for r in reasons) else ""
    return "partial scan: " + ", ".join(dict.fromkeys(reasons)) + hint


def cut_plan_message(dry_run: bool) -> str:
    """What a purge whose plan the time limit cut does: only what was proven goes."""
    verb = "would go" if dry_run else "went"
    return (f"the plan was cut short, so only what it proved {verb}: the names given and "
            f"the hidden holders that are their objects; hidden holders that only share "
            f"their memory stay (raise GpuMemMagics.scan_time_limit to look further)")


def list_message(texts: list[str], dry_run: bool) -> str:
    """What a path into a list leaves there (``None``: the list keeps its length)."""
    verb = "would hold" if dry_run else "now holds" if len(texts) == 1 else "now hold"
    return (f"{', '.join(texts)} {verb} None: a list keeps its length, so its other "
            f"positions stay as they were")



def skipped_messages(skipped: list[str], dry_run: bool) -> list[str]:
    """The names that went or changed on their own while the purge ran."""
    if not skipped:
        return []
    one = len(skipped) == 1
    rest = "would be" if dry_run else "was"
    return [f"skipped {', '.join(skipped)}: {'it' if one else 'they'} went or changed on "
            f"{'its' if one else 'their'} own while the purge ran (another thread?); "
            f"the rest {rest} purged"]



def out_key_message(count: int, nbytes: int) -> str:
    """Entries of ``Out`` under a key of the user's own type, left in place."""
    return (f"{count} entr{'y' if count == 1 else 'ies'} of Out under a key that is "
            f"not a number or a string (Out[...]) keep{'s' if count == 1 else ''} "
            f"{fmt_bytes(nbytes)}: left in place, as finding the key again would run its "
            f"own code; `del Out[key]` frees it")


def still_messages(still: list[StillHeld]) -> list[str]:
    """One line per holder of memory the purge meant to free (a name to purge too, a
    module's global to clear, or unnamed); many names holding as much, one line."""
    out = []
    same: dict[int, list[str]] = {}
    for s in still:
        if s.kind == "name":
            same.setdefault(s.nbytes, []).append(s.by)
    for s in still:
        size = fmt_bytes(s.nbytes)
        group = same.get(s.nbytes, ()) if s.kind == "name" else ()
        if len(group) > GROUP_AT:
            if s.by == group[0]:
                shown = ", ".join(group[:GROUP_AT])
                out.append(f"{shown} and {len(group) - GROUP_AT} other name(s) still hold "
                           f"{size} each of the memory this purge meant to free: purge them "
                           "too (`%gpumem` lists them)")
            continue
        if s.kind == "library":
            out.append(f"{s.path} (a module's global) still holds {size} of the memory this "
                       f"purge meant to free, so that was "
                       f"not freed: clear it there to free it")
        elif s.kind == "unnamed":
            out.append(f"{size} of the memory this purge meant to free is still alive, held "
                       f"by {UNNAMED} and modules' globals: "
                       f"not freed")
        else:
            where = "" if s.path == s.by else f" ({s.path})"   # the name alone says it
            out.append(f"{s.by} still holds {size} of the memory this purge meant to "
                       f"free{where}: purge {s.by} too")
    return out
