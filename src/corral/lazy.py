"""Names a package exports lazily (PEP 562): imported from their module on first use.

``__getattr__ = lazy_exports(__name__, {"name": "module", ...}, globals())`` in a
package makes ``package.name`` import ``module`` the first time it is read and keep
the value; any other name is an ``AttributeError``. Used where start-up matters:
``corral`` itself, and the SDK every rank imports.
"""

from __future__ import annotations

import importlib

TYPE_CHECKING = False  # typing is not imported: ``corral`` itself uses this module
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any


def lazy_exports(
    owner: str, table: Mapping[str, str], namespace: dict[str, Any]
) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``owner`` that resolves the names of ``table``
    (name -> module) and stores each one in ``namespace`` (the module's globals)."""

    def __getattr__(name: str) -> Any:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {owner!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    return __getattr__
