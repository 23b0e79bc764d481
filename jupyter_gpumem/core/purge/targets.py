"""The names a purge was asked for, as targets: one mechanism for the notebook's purge
(what a name holds: storage keys) and a cluster's (what a name holds: Dask keys).

A :class:`Holdings` says what a root or another object holds and how to word a name
that holds nothing; :func:`resolve_targets` checks every name against it before
anything is deleted; :func:`hidden_to_clear` and :func:`removed_names` pick IPython's
hidden holders that go with the targets; :mod:`.execution` removes them all.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..scan import paths as _paths
from ..scan import Root
from ...backends.base import is_a


@dataclass
class Target:
    """One name a purge was asked for: its binding, its root and what it holds
    (storage key -> path node; on a cluster, Dask key -> path)."""

    text: str
    binding: _paths.Binding | None      # None for hidden holders named directly
    root: Root | None             # the root this name is, if it is one
    keys: dict = field(default_factory=dict)


class Holdings:
    """What the roots of one purge hold; the notebook's and a cluster's purge each say
    it their own way (the scan's storages, the Dask keys of Futures)."""

    def of(self, root: Root) -> dict:
        """What ``root`` (one of the roots collected for the plan) holds."""
        raise NotImplementedError

    def of_object(self, text: str, obj: Any) -> tuple[dict, str]:
        """What ``obj``, found at path ``text`` and not a root, holds; and what to say
        when that is nothing."""
        raise NotImplementedError

    def nothing(self, text: str) -> str:
        """What to say when the root ``text`` names holds nothing."""
        raise NotImplementedError

    def direct(self, text: str) -> list[Target] | str | None:
        """The targets of a name that stands for hidden holders (not a path), an error
        for one that holds nothing, or None for a name to resolve as a path."""
        return None


def names_of(roots: list[Root]) -> dict[str, Root]:
    """Each root by the names it is known by: the user's names, then the hidden holders'
    names and aliases (``Out[3]``, ``_3``) that no user name shadows."""
    by_name = {r.name: r for r in roots if not r.hidden}
    for r in roots:
        if r.hidden:
            for n in [r.name] + list(r.aliases):
                by_name.setdefault(n, r)
    return by_name


def resolve_targets(names: list[str], roots: list[Root], holdings: Holdings, *, shell: Any,
                    namespace: dict | None, all_names: bool = False
                    ) -> tuple[list[Target], list[str], list[str]]:
    """The targets of ``names``; the names skipped (with ``all_names``: gone or rebound
    on their own since the roots were collected); and the errors, one per bad name (the
    caller raises them all before anything is deleted)."""
    by_name = names_of(roots)
    errors: list[str] = []
    skipped: list[str] = []
    targets: list[Target] = []
    for text in names:
        found = holdings.direct(text)
        if is_a(found, str):
            errors.append(found)
            continue
        if found is not None:
            targets += found
            continue
        try:
            binding = _paths.resolve(text, shell=shell, namespace=namespace)
            _paths.check_deletable(binding)
        except _paths.PathError as exc:
            if all_names:   # a name purge itself listed: it went since (another thread?)
                skipped.append(text)
            else:
                errors.append(str(exc))
            continue
        root = by_name.get(text)
        if root is None and binding.is_name:   # ``globals()["x"]`` for ``x``
            root = by_name.get(binding.root_name)
        if all_names and (root is None or root.obj is not binding.obj):
            skipped.append(text)   # rebound since it was listed: not what --all found
            continue
        if root is not None and root.obj is binding.obj:
            keys, why = holdings.of(root), holdings.nothing(text)
        else:
            root = None
            keys, why = holdings.of_object(text, binding.obj)
        if not keys:
            errors.append(why)
            continue
        targets.append(Target(text, binding, root, keys))
    return targets, skipped, errors


def hidden_to_clear(roots: list[Root], holdings: Holdings, targets: list[Target],
                    hidden_only: bool, own) -> list[Root]:
    """The hidden holders that go: for a purge of the hidden holders only (no name, no
    ``--all``), all that hold something; else those that are a target's object or hold
    what only the targets held (``own``), and none where ``--all`` took no name."""
    objs = {id(t.binding.obj) for t in targets if t.binding is not None} | \
        {id(t.root.obj) for t in targets if t.root is not None}
    out = []
    for r in roots:
        if not r.hidden:
            continue
        held = holdings.of(r)
        if held and (hidden_only or id(r.obj) in objs or own & held.keys()):
            out.append(r)
    return out


def removed_names(targets: list[Target], hidden_clear: list[Root], names: list[str]) -> list[str]:
    """What a purge removes, each once: the targets, then the hidden holders' names."""
    return list(dict.fromkeys([t.text for t in targets] + [
        n for r in hidden_clear for n in [r.name] + list(r.aliases) if n not in names]))
