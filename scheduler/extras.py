"""Optional backends' packages: imported when first needed, with an error that names the extra."""

from __future__ import annotations

import importlib
from types import ModuleType

from jobq.errors import MissingExtra


def require(module: str, extra: str, feature: str) -> ModuleType:
    """Import `module` or raise `MissingExtra` naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingExtra(feature, extra, module.split(".", maxsplit=1)[0]) from None
