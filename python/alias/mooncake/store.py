"""kvpool's classes under Mooncake's module name (see mooncake/__init__.py of this alias)."""
from kvpool import (  # noqa: F401
    BufferHandle,
    MooncakeDistributedStore,
    ReplicaDescriptor,
    ReplicateConfig,
    SoftPinAction,
    errname,
)
