"""The extension's settings: one Configurable, set in ``ipython_config.py``
(``c.GpuMemMagics.scan_time_limit = 5``) or with ``%config GpuMemMagics...``.

The magics' class is this configurable (it inherits the traits), and the shell's
:class:`~jupyter_gpumem.session.Session` owns it: the footer, the panel and the
sidebar all read the user's settings through ``session.settings``.
"""
from __future__ import annotations

import math
import sys
import warnings

from typing import Any

from traitlets import Bool, Float, TraitError, Unicode, Union, observe, validate
from traitlets.config import Configurable

from .core import devices as _devices
from .core.sampler import check_interval


def parse_share(value: Any) -> float | None:
    """``"80%"``, ``0.8`` or ``80`` -> 0.8; ``None``/``"off"`` -> None; ValueError otherwise."""
    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("", "off", "none", "no"):
            return None
        percent = text.endswith("%")
        number = float(text.rstrip("%").strip())
        share = number / 100 if percent or number > 1 else number
    else:
        number = float(value)
        share = number / 100 if number > 1 else number
    if not 0 < share <= 1:
        raise ValueError(f"a share between 0% and 100% is needed, not {value!r}")
    return share


def fmt_share(share: float) -> str:
    """A share as a percentage with the precision it was given: 0.8 -> ``80%``,
    0.001 -> ``0.1%``, 0.125 -> ``12.5%``."""
    return f"{round(share * 100, 6):g}%"


def check_time_limit(value: Any, what: str = "time_limit") -> float:
    """``value`` as seconds, finite and above 0; one-line ValueError otherwise (NaN would
    never cut a scan, 0 or less would report nothing)."""
    try:
        seconds = float(value)
    except (TypeError, ValueError, OverflowError):
        seconds = math.nan
    if isinstance(value, bool) or not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"{what} needs a finite number of seconds above 0, not {value!r}")
    return seconds


def select_device(value: Any, what: str = "device") -> _devices.DeviceSelection:
    """A device selection this process has (``cuda:0`` only where there is one), made
    once (:func:`~jupyter_gpumem.core.devices.select`); one-line ValueError otherwise:
    the check of every device that enters (settings, the script API), as ``--device``
    is checked by the magics."""
    try:
        return _devices.select(value)
    except ValueError as exc:
        raise ValueError(f"{what}: {exc}") from None


def check_device(value: Any, what: str = "device") -> str:
    """:func:`select_device`'s selection, parsed (``auto``, ``cpu``, ``cuda:0``, ...):
    what a setting keeps."""
    return select_device(value, what).device


def _checked(trait: str, check, keep_parsed: bool) -> Any:
    """A traitlets validator of ``trait`` by ``check(value, what)``: its ValueError (or
    TypeError) becomes a TraitError naming ``GpuMemMagics.<trait>``; the trait keeps what
    the check returned (``keep_parsed``: seconds) or the value as given (``"80%"``)."""
    what = f"GpuMemMagics.{trait}"

    def _validate(self, proposal):
        try:
            parsed = check(proposal["value"], what)
        except (TypeError, ValueError) as exc:
            text = str(exc)
            raise TraitError(text if text.startswith(what) else f"{what}: {text}") from None
        return parsed if keep_parsed else proposal["value"]
    return validate(trait)(_validate)


#: the lines said of rejected settings in ipython_config.py, each once per process
_SAID: set = set()

class GpuMemSettings(Configurable):
    """What the user can set; the magics (``GpuMemMagics``) carry these traits.

    ``warn_share`` is ``warn_at`` parsed (a share in (0, 1], or None): parsed once,
    when ``warn_at`` is set, and read by the footer after every cell."""

    #: ``warn_at`` as a share of the device (None: no warning); kept up to date with it
    warn_share: float | None = None

    default_device = Unicode("auto", help="device used when --device is not given: "
                             "auto (accelerators, else cpu), all, cpu, cuda:N").tag(config=True)
    scan_time_limit = Float(3.0, help="seconds a scan may take before it reports a "
                            "partial result").tag(config=True)
    watch = Bool(False, help="show the per-cell memory footer from the start").tag(config=True)
    warn_at = Union([Float(), Unicode()], default_value=None, allow_none=True,
                    help="warn after a cell that leaves a device above this share "
                    "(0.8 or '80%')").tag(config=True)
    auto_purge_hidden = Bool(False, help="with warn_at: clear hidden holders and caches "
                             "when the threshold is crossed").tag(config=True)
    sample_interval = Float(0.05, help="seconds between NVML samples while a "
                            "watched cell runs").tag(config=True)
    tame = Bool(False, help="on load, make JAX and TensorFlow allocate on demand "
                "instead of grabbing the card").tag(config=True)
    trace = Union([Bool(), Unicode()], default_value=False,
                  help="record where each block was allocated from the first cell: True or "
                  "'cell' (the cell, nearly free: %gpumem trace on at load), 'lines' (the "
                  "line too, with Python stacks: %gpumem trace on --lines)").tag(config=True)

    @validate("trace")
    def _check_trace(self, proposal):
        value = proposal["value"]
        if value in (True, False, "cell", "lines"):
            return value
        raise TraitError(f"GpuMemMagics.trace must be True, False, 'cell' or 'lines' "
                         f"(got {value!r})")

    def _load_config(self, cfg, section_names=None, traits=None) -> None:
        """A bad value in ``ipython_config.py`` costs one line and keeps that setting's
        default; the other settings load (a ``%config`` of a bad value is refused by the
        validators below, as any trait's)."""
        try:
            super()._load_config(cfg, section_names, traits)
            return
        except TraitError:
            pass
        for name, trait in (traits or self.traits(config=True)).items():
            try:
                with warnings.catch_warnings():   # the other keys: "not recognized" here
                    warnings.simplefilter("ignore", UserWarning)
                    super()._load_config(cfg, section_names, {name: trait})
            except TraitError as exc:
                line = f"jupyter_gpumem: {exc}; the setting keeps {getattr(self, name)!r}"
                if line not in _SAID:   # once per process, not again at each %reload_ext
                    _SAID.add(line)
                    print(line, file=sys.stderr)

    # each value is checked where it enters, by the one check of its kind: a bad one is
    # refused with that check's one line (a TraitError), the setting unchanged
    _check_warn_at = _checked("warn_at", lambda value, _what: parse_share(value), False)
    _check_sample_interval = _checked("sample_interval", check_interval, True)
    _check_default_device = _checked("default_device", check_device, False)
    _check_scan_time_limit = _checked("scan_time_limit", check_time_limit, True)

    @observe("warn_at")
    def _parse_warn_at(self, change) -> None:
        self.warn_share = parse_share(change["new"])
