"""Opt-in alias: `mooncake.store` names kvpool's classes, so connector code that imports
`from mooncake.store import MooncakeDistributedStore` runs on kvpool unmodified.

Not installed by anything (neither `cmake --install` nor the wheel): put this directory's
parent (python/alias) on PYTHONPATH to use it. A real Mooncake installation is never
shadowed: if another `mooncake` package is importable from any other sys.path entry, that one
is loaded in place of this alias.
"""
import importlib.machinery
import importlib.util
import os
import sys

_here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_others = [p for p in sys.path if os.path.abspath(p or os.getcwd()) != _here]
_spec = importlib.machinery.PathFinder.find_spec(__name__, _others)
if _spec is not None and _spec.origin and os.path.abspath(_spec.origin) != os.path.abspath(__file__):
    _real = importlib.util.module_from_spec(_spec)
    sys.modules[__name__] = _real  # the import statement returns this module
    _spec.loader.exec_module(_real)
else:
    KVPOOL_ALIAS = True
