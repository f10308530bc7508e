"""kvpool: the Python client of the kvpool KV-cache store.

``kvpool.MooncakeDistributedStore`` offers the surface of Mooncake's
``mooncake.store.MooncakeDistributedStore`` that vLLM, SGLang and LMCache call, over libkvpool.
Behaviour, error numbers and what differs from Mooncake: docs/python.md.

The data calls are in the C extension ``kvpool._kvpool`` (GIL released around every call that
can block); this file adds ``setup``, the descriptor classes and the calls that are thin
compositions of others.
"""

import enum
import threading

from kvpool import _kvpool

__all__ = [
    "MooncakeDistributedStore",
    "ReplicateConfig",
    "SoftPinAction",
    "ReplicaDescriptor",
    "BufferHandle",
    "errname",
    "ERRORS",
]

# ---------------------------------------------------------------------------------- errors

#: Every number a call can return, with its name (docs/python.md has the table). Mooncake's
#: numbers where Mooncake has the meaning; -1000 + kvpool's code for the rest.
ERRORS = {
    -200: "NO_AVAILABLE_HANDLE",      # KVP_ERR_NO_SPACE: the pool cannot take the object now
    -600: "INVALID_PARAMS",           # bad argument, buffer too small, not set up, too large, device memory
    -704: "OBJECT_NOT_FOUND",
    -705: "OBJECT_ALREADY_EXISTS",    # put turns it into 0
    -706: "OBJECT_HAS_LEASE",
    -707: "LEASE_EXPIRED",
    -800: "TRANSFER_FAIL",
    -801: "CHECKSUM_MISMATCH",
    -900: "RPC_FAIL",                 # no master quorum / no leader
    -901: "TIMEOUT",
}
for _code in range(-13, -27, -1):
    _n = _kvpool.map_code(_code)
    if _n <= _kvpool.KVP_BASE:
        ERRORS.setdefault(_n, _kvpool.kvp_errname(_code))


def errname(code):
    """The name of a number returned by this module ("OBJECT_NOT_FOUND" for -704, "OK" for 0,
    "UNKNOWN(-n)" for a number this module never returns)."""
    if not isinstance(code, int):
        raise TypeError("code must be int, not %s" % type(code).__name__)
    if code >= 0:
        return "OK"
    return ERRORS.get(code, "UNKNOWN(%d)" % code)


# ---------------------------------------------------------------------------------- config


class SoftPinAction(enum.IntEnum):
    """What a put does to the object's soft pin."""

    PRESERVE = 0
    ENABLE = 1
    DISABLE = 2


_U64_MAX = (1 << 64) - 1

# endpoint "host:port" of a store's own segment -> its segment name, for preferred_segment
# given as get_hostname()'s value (Mooncake's convention). Written at setup and close only.
_own_segments = {}


class ReplicateConfig:
    """Placement of a put. Fields as Mooncake's; kvpool honours replica_num,
    preferred_segment (or the first of preferred_segments) and soft pinning
    (with_soft_pin or soft_pin_action=ENABLE). The others are kept and ignored."""

    def __init__(self):
        self.replica_num = 1
        self.with_soft_pin = False
        self.with_hard_pin = False
        self.preferred_segment = ""
        self.preferred_segments = []
        self.soft_pin_action = SoftPinAction.PRESERVE
        self._ttl = None
        self.prefer_alloc_in_same_node = False

    @property
    def soft_pin_ttl_ms(self):
        return self._ttl

    @soft_pin_ttl_ms.setter
    def soft_pin_ttl_ms(self, v):
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0 or v > _U64_MAX - 1):
            raise TypeError("soft_pin_ttl_ms must be None or an int in [0, 2**64-1), not %r" % (v,))
        self._ttl = v

    # read by the C extension
    @property
    def _kvp_soft_pin(self):
        return bool(self.with_soft_pin) or self.soft_pin_action == SoftPinAction.ENABLE

    @property
    def _kvp_invalid(self):
        return self._ttl is not None and self.soft_pin_action != SoftPinAction.ENABLE

    @property
    def _kvp_preferred(self):
        seg = self.preferred_segment or (self.preferred_segments[0] if self.preferred_segments else "")
        if not isinstance(seg, str):
            raise TypeError("preferred_segment must be str, not %s" % type(seg).__name__)
        return _own_segments.get(seg, seg)

    def __repr__(self):
        return "ReplicateConfig(replica_num=%d, preferred_segment=%r, with_soft_pin=%s, soft_pin_action=%s)" % (
            self.replica_num, self.preferred_segment, self.with_soft_pin, self.soft_pin_action.name
            if isinstance(self.soft_pin_action, SoftPinAction) else self.soft_pin_action)

    __str__ = __repr__


class ReplicaDescriptor:
    """One replica of an object, as batch_get_replica_desc returns them. kvpool keeps every
    replica in memory (no disk tier yet)."""

    __slots__ = ()

    def is_memory_replica(self):
        return True

    def is_disk_replica(self):
        return False

    def is_local_disk_replica(self):
        return False

    def __repr__(self):
        return "ReplicaDescriptor(memory)"


class BufferHandle(bytes):
    """An object read by batch_get_buffer: bytes(h), memoryview(h), len(h) and h.size() work."""

    def size(self):
        return len(self)


# ---------------------------------------------------------------------------------- sizes

_UNITS = {"": 0, "b": 0, "k": 10, "kb": 10, "kib": 10, "m": 20, "mb": 20, "mib": 20,
          "g": 30, "gb": 30, "gib": 30, "t": 40, "tb": 40, "tib": 40}


def _size(v, name):
    """A size as Mooncake takes it: an int of bytes, or a string such as "4GB", "16 MB"."""
    if isinstance(v, bool):
        raise TypeError("%s must be an int or a size string, not bool" % name)
    if isinstance(v, int):
        if v < 0:
            raise ValueError("%s must be >= 0, not %d" % (name, v))
        return v
    if isinstance(v, str):
        s = v.strip()
        i = 0
        while i < len(s) and s[i].isdigit():
            i += 1
        unit = s[i:].strip().lower()
        if i == 0 or unit not in _UNITS:
            raise ValueError("%s=%r: not a size (bytes, or with K|M|G|T, KB|KiB... e.g. \"4GB\", \"16 MB\")"
                             % (name, v))
        return int(s[:i]) << _UNITS[unit]
    raise TypeError("%s must be an int or a size string, not %s" % (name, type(v).__name__))


_logged_metadata = False
_log_lock = threading.Lock()


def _log_metadata_once(value):
    global _logged_metadata
    with _log_lock:
        if _logged_metadata:
            return
        _logged_metadata = True
    _kvpool._log("info", "metadata_server=%r is ignored: kvpool keeps its metadata in its masters" % (value,))


# ---------------------------------------------------------------------------------- the store

# Mooncake config names handled here; any other key of setup(dict) goes to kvpool's config
# as it is (kvpool's own keys: log_level, drain_timeout_ms, replica_num, cluster_file, ...).
_DICT_DEFAULTS = {"global_segment_size": 16 << 20, "local_buffer_size": 16 << 20, "protocol": "tcp"}


class MooncakeDistributedStore(_kvpool.Store):
    """The store inference servers call. No I/O until setup()."""

    def setup(self, local_hostname=None, metadata_server=None, global_segment_size=None,
              local_buffer_size=None, protocol="tcp", rdma_devices="", master_server_addr=None,
              engine=None, *, enable_ssd_offload=False, ssd_offload_path="", tenant_id="",
              enable_client_http_server=False, client_http_port=0, drain_timeout_ms=None,
              cluster_file=None, auth=None, auth_key=None, auth_master_keys=None):
        """setup(local_hostname, metadata_server, global_segment_size, local_buffer_size,
        protocol, rdma_devices, master_server_addr, engine=None, **kwargs) or setup(dict).
        Returns 0 or a negative number; raises TypeError/ValueError for a wrong argument type.
        Authentication (docs/security.md): cluster_file (a cluster.json whose "auth" section
        names this client's key and the masters' public keys), or auth_key (the PATH_secret of
        this client's key pair) and auth_master_keys (directory of the masters' public keys);
        auth="none" connects without. tenant_id, when given, must be the key's tenant."""
        if isinstance(local_hostname, dict):
            if metadata_server is not None or master_server_addr is not None:
                raise TypeError("setup(dict) takes the dict only")
            return self._setup_items(self._from_dict(local_hostname))
        if local_hostname is None or master_server_addr is None:
            raise TypeError("setup() needs local_hostname and master_server_addr (or one dict)")
        if global_segment_size is None or local_buffer_size is None:
            raise TypeError("setup() needs global_segment_size and local_buffer_size")
        for name, v in (("local_hostname", local_hostname), ("protocol", protocol),
                        ("master_server_addr", master_server_addr), ("tenant_id", tenant_id),
                        ("ssd_offload_path", ssd_offload_path)):
            if not isinstance(v, str):
                raise TypeError("%s must be str, not %s" % (name, type(v).__name__))
        if not isinstance(rdma_devices, (str, list, tuple)):
            raise TypeError("rdma_devices must be str, not %s" % type(rdma_devices).__name__)
        cfg = {
            "local_hostname": local_hostname,
            "metadata_server": metadata_server,
            "global_segment_size": global_segment_size,
            "local_buffer_size": local_buffer_size,
            "protocol": protocol,
            "device_name": rdma_devices if isinstance(rdma_devices, str) else ",".join(rdma_devices),
            "master_server_address": master_server_addr,
            "tenant_id": tenant_id,
            "enable_ssd_offload": enable_ssd_offload,
            "enable_client_http_server": enable_client_http_server,
        }
        if drain_timeout_ms is not None:
            cfg["drain_timeout_ms"] = drain_timeout_ms
        for name, v in (("cluster_file", cluster_file), ("auth", auth), ("auth_key", auth_key),
                        ("auth_master_keys", auth_master_keys)):
            if v is not None:
                if not isinstance(v, str):
                    raise TypeError("%s must be str, not %s" % (name, type(v).__name__))
                cfg[name] = v
        if engine is not None:
            _kvpool._log("info", "setup: engine=%r is ignored (kvpool has its own transfer engine)"
                         % type(engine).__name__)
        return self._setup_items(self._from_dict(cfg, defaults=False))

    @staticmethod
    def _from_dict(d, defaults=True):
        """Mooncake's config dict -> (kvpool key, value string) pairs and the staging size."""
        items = []
        d = dict(d)
        if defaults:
            for k, v in _DICT_DEFAULTS.items():
                d.setdefault(k, v)
        if "master_server_addr" in d and "master_server_address" not in d:
            d["master_server_address"] = d.pop("master_server_addr")
        if "rdma_devices" in d and "device_name" not in d:
            d["device_name"] = d.pop("rdma_devices")
        lbs = 0
        for k, v in d.items():
            if not isinstance(k, str):
                raise TypeError("config keys must be str, not %s" % type(k).__name__)
            if k == "metadata_server":
                _log_metadata_once(v)
                continue
            if k in ("enable_ssd_offload", "enable_client_http_server"):
                if v not in (False, None, "", "false", "False", "0", 0):
                    _kvpool._log("warn", "setup: %s is not available in kvpool (ignored)" % k)
                continue
            if k in ("ssd_offload_path", "client_http_port", "master_metrics_port", "check_server",
                     "engine"):
                continue
            if v is None:
                continue
            if k in ("global_segment_size", "local_buffer_size"):
                n = _size(v, k)
                if k == "local_buffer_size":
                    lbs = n
                items.append((k, str(n)))
            elif k == "transfer_timeout":  # Mooncake's unit: seconds
                if isinstance(v, bool) or not isinstance(v, (int, float, str)):
                    raise TypeError("transfer_timeout must be a number of seconds, not %s" % type(v).__name__)
                if isinstance(v, str) and not v.replace(".", "", 1).isdigit():
                    items.append((k, v))  # "30s", "1500ms": kvpool's own form
                else:
                    items.append((k, "%dms" % int(float(v) * 1000)))
            elif k == "local_hostname":
                if not isinstance(v, str):
                    raise TypeError("local_hostname must be str, not %s" % type(v).__name__)
                host = v
                if v.count(":") == 1:  # "host:port": kvpool picks its data-plane port itself
                    host = v.split(":")[0]
                elif v.startswith("[") and "]:" in v:
                    host = v[1:v.index("]:")]
                items.append((k, host or "127.0.0.1"))
            elif isinstance(v, bool):
                items.append((k, "true" if v else "false"))
            elif isinstance(v, (int, float, str)):
                items.append((k, str(v)))
            else:
                raise TypeError("config value of %s must be str, int or bool, not %s" % (k, type(v).__name__))
        return items, lbs, d.get("local_hostname", "")

    def _setup_items(self, parsed):
        items, lbs, hostname = parsed
        rc = self._open(items, lbs)
        if rc == 0:
            self.tenant_id = dict(items).get("tenant_id", "")
            self._hostname = hostname if isinstance(hostname, str) else ""
            seg = self._segment()
            self._seg = seg
            if seg:
                _own_segments[seg[1]] = seg[0]
            if self.tenant_id:
                _kvpool._log("info", "setup: tenant_id=%r (the key's tenant)" % self.tenant_id)
        return rc

    def close(self):
        """Drain this client's own segment (bounded by drain_timeout_ms, default 30 s), then
        close. Idempotent; setup() works again afterwards. Returns 0."""
        seg = getattr(self, "_seg", None)
        rc = _kvpool.Store.close(self)
        if seg:
            _own_segments.pop(seg[1], None)
            self._seg = None
        return rc

    def get_hostname(self):
        """"host:port" of this client's own segment (usable as preferred_segment); without one,
        local_hostname as given to setup."""
        seg = getattr(self, "_seg", None)
        if seg:
            return seg[1]
        return getattr(self, "_hostname", "")

    def batch_get_buffer(self, keys):
        """list of BufferHandle, or None for a key that could not be read."""
        return [None if b is None else BufferHandle(b) for b in self._get_buffers(keys)]

    def put_parts(self, key, *parts, config=None):
        """Store the concatenation of parts (bytes-like) under key."""
        for i, p in enumerate(parts):
            if isinstance(p, (str, int)) or p is None:
                raise TypeError("parts[%d] must be a bytes-like object, not %s" % (i, type(p).__name__))
        try:
            value = b"".join(parts)
        except TypeError:
            raise TypeError("parts must be bytes-like objects") from None
        return self.put(key, value, config)

    def upsert(self, key, value, config=None):
        """put that replaces an existing object (not atomic: a reader in between sees a miss).
        Returns 0 or a negative number."""
        if config is not None and getattr(config, "_kvp_invalid", False):
            _kvpool._log("warn", "upsert: soft_pin_ttl_ms set without SoftPinAction.ENABLE (-600)")
            return -600
        # the value as put() takes it (bytes-like; an int or str is a TypeError naming value,
        # not bytes(5) = five zero bytes), checked before the old object is removed
        if isinstance(value, (str, int)) or value is None:
            raise TypeError("value must be a bytes-like object, not %s" % type(value).__name__)
        try:
            value = bytes(value)
        except TypeError:
            raise TypeError("value must be a bytes-like object, not %s" % type(value).__name__) from None
        if len(value) == 0:
            _kvpool._log("warn", "upsert: key %r: an empty value (objects are 1 byte or larger): -600" % (key,))
            return -600
        if not self._staging_ok("upsert", key, len(value)):
            return -600  # checked before the remove: a failing upsert keeps the old object
        if self.is_exist(key) == 1:
            rc = self.remove(key, True)
            if rc not in (0, -704):
                return rc
        return self.put(key, value, config)

    def batch_get_replica_desc(self, keys):
        """{key: [ReplicaDescriptor, ...]} for the keys that exist (one per complete replica)."""
        counts = self._replica_counts(keys)
        return {k: [ReplicaDescriptor() for _ in range(n)] for k, n in zip(keys, counts) if n > 0}

    def _device_ranges(self, ptr, ks, ds, ss, zs):
        """get_into_ranges into GPU memory: the CPU must not write it, so each range is one
        scatter-gather get of the whole object whose piece [s, s+z) lands at ptr+d (through
        kvpool's staging) and whose other bytes go to host scratch."""
        import ctypes

        row = []
        for k, d, s, z in zip(ks, ds, ss, zs):
            if not (isinstance(d, int) and isinstance(s, int) and isinstance(z, int)) or d < 0 or s < 0 or z <= 0:
                row.append(-600)
                continue
            size = self.get_size(k)
            if size < 0:
                row.append(size)
                continue
            if s + z > size:
                row.append(-600)
                continue
            ptrs, lens, keep = [], [], []
            if s > 0:
                keep.append(ctypes.create_string_buffer(s))
                ptrs.append(ctypes.addressof(keep[-1]))
                lens.append(s)
            ptrs.append(ptr + d)
            lens.append(z)
            if size - s - z > 0:
                keep.append(ctypes.create_string_buffer(size - s - z))
                ptrs.append(ctypes.addressof(keep[-1]))
                lens.append(size - s - z)
            r = self.batch_get_into_multi_buffers([k], [ptrs], [lens])[0]
            row.append(z if r == size else (r if r < 0 else -600))
        return row

    def get_into_ranges(self, buffer_ptrs, keys, dst_offsets, src_offsets, sizes):
        """Ranged reads, buffer-major: for buffer i and range j, copy sizes[i][j] bytes of object
        keys[i][j] from offset src_offsets[i][j] to buffer_ptrs[i] + dst_offsets[i][j]. Returns
        nested byte counts or negative numbers (-600 for a bad shape or a range past the object,
        -704 for a miss). Reads each object whole (kvpool has no ranged read yet)."""
        for name, v in (("buffer_ptrs", buffer_ptrs), ("keys", keys), ("dst_offsets", dst_offsets),
                        ("src_offsets", src_offsets), ("sizes", sizes)):
            if not isinstance(v, (list, tuple)):
                raise TypeError("%s must be a list, not %s" % (name, type(v).__name__))
        out = []
        for i, ptr in enumerate(buffer_ptrs):
            if isinstance(ptr, bool) or not hasattr(type(ptr), "__index__"):
                raise TypeError("buffer_ptrs[%d] must be int, not %s" % (i, type(ptr).__name__))
            ptr = ptr.__index__()  # int, or numpy.uint64 and the like, as the C calls take them
            if ptr < 0:
                raise ValueError("buffer_ptrs[%d] must be an int in [0, 2**64)" % i)
            try:
                ks, ds, ss, zs = keys[i], dst_offsets[i], src_offsets[i], sizes[i]
            except IndexError:
                out.append([])
                continue
            if not (len(ks) == len(ds) == len(ss) == len(zs)):
                out.append([-600] * len(ks))
                continue
            if ptr == 0:  # a NULL buffer: every range of the row, whatever its offset
                _kvpool._log("warn", "get_into_ranges: buffer_ptrs[%d] is 0 (NULL): -600 for its %d ranges"
                             % (i, len(ks)))
                out.append([-600] * len(ks))
                continue
            dev = _kvpool._device_pointer(ptr)
            if dev != 0:
                out.append(self._device_ranges(ptr, ks, ds, ss, zs) if dev == 1 else [dev] * len(ks))
                continue
            row = []
            cache = {}
            for k, d, s, z in zip(ks, ds, ss, zs):
                if k not in cache:
                    cache[k] = self.get(k)
                    if not cache[k]:
                        # get() gives b"" for a miss and for every error: ask why, so that an
                        # object that exists but cannot be staged (local_buffer_size) is -600
                        # and a master that does not answer is -900, not a miss
                        sz = self.get_size(k)
                        cache[k] = -704 if sz == 0 else (-600 if sz > 0 else sz)
                obj = cache[k]
                if isinstance(obj, int):
                    row.append(obj)
                elif (not isinstance(d, int) or not isinstance(s, int) or not isinstance(z, int)
                      or d < 0 or s < 0 or z < 0 or s + z > len(obj) or ptr + d + z > _U64_MAX):
                    row.append(-600)
                else:
                    # checked in C: a NULL or GPU destination is -600, not a segfault
                    row.append(_kvpool._copy_out(ptr + d, obj, s, z))
            out.append(row)
        return out
