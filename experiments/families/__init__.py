"""Kernel families, by name: :func:`get` returns a family, :func:`names` lists them, :data:`DEFAULT`
names the one a config without ``family=`` runs.

Each family (one module here, or a package: the default family's) implements
:class:`~experiments.families.base.Family`; the runner knows nothing family-specific beyond this
registry (:mod:`.runner`: the family, spec and resources of a config, for ``experiments.runner.kernel``;
docs/DESIGN.md: how to add a family).
"""
from __future__ import annotations

from ..spec import SpecError
from .base import Build, Family, FamilySpec, Prepared, Rule
from .cublas import CublasFamily
from .dp4a import Dp4aFamily
from .mma_sync import MmaSyncFamily
from .peak import PeakFamily
from .wgmma import WgmmaFamily
from .wmma import WmmaFamily

__all__ = ["get", "names", "DEFAULT", "Family", "FamilySpec", "Build", "Prepared", "Rule"]

_CLASSES = (MmaSyncFamily, WmmaFamily, Dp4aFamily, CublasFamily, PeakFamily, WgmmaFamily)

DEFAULT = MmaSyncFamily.name       # the study's own family: its options are the config's root keys


def names() -> tuple[str, ...]:
    """Registered family names, in registry order."""
    return tuple(c.name for c in _CLASSES)


def get(name: str) -> Family:
    """The family called ``name`` (a new, stateless instance).

    Raises SpecError naming the valid families for an unknown name.
    """
    for cls in _CLASSES:
        if cls.name == name:
            return cls()
    raise SpecError(f"family={name!r} is not valid; valid: {', '.join(names())}")
