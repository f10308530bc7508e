#!/usr/bin/env bash
# The two ways to install the binding, checked (CTest test_python_install):
#  1. cmake --install into a temporary prefix: `import kvpool` from its site directory;
#  2. the wheel, built offline: python3 -m pip wheel --no-build-isolation ./python; it holds
#     kvpool/__init__.py and kvpool/_kvpool.abi3.so (abi3 tag, no mooncake alias), and imports.
# Usage: install_check.sh   (KVP_BUILD_DIR names the build directory; KVP_PYTHON the interpreter)
set -euo pipefail
SRC=$(cd "$(dirname "$0")/../.." && pwd)
B=$(cd "${KVP_BUILD_DIR:-$SRC/build}" && pwd)
PY=${KVP_PYTHON:-/usr/bin/python3}
T=$(mktemp -d /tmp/kvp-pyinstall.XXXXXX)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

cmake --install "$B" --prefix "$T/prefix" >/dev/null
SITE=$(find "$T/prefix" -name __init__.py -path '*/kvpool/*' -printf '%h\n' | head -1)
[ -n "$SITE" ] && [ -f "$SITE/_kvpool.abi3.so" ] || fail "cmake --install: no kvpool package under $T/prefix"
(cd "$T" && PYTHONPATH=$(dirname "$SITE") "$PY" -c 'import kvpool, sys; assert kvpool.__file__.startswith(sys.argv[1]); print("cmake --install:", kvpool.__file__)' "$T/prefix") \
  || fail "import after cmake --install"

KVP_BUILD_DIR=$B "$PY" -m pip wheel --no-build-isolation --no-deps --no-index -q -w "$T/wheel" "$SRC/python" >"$T/pip.log" 2>&1 \
  || { cat "$T/pip.log"; fail "pip wheel"; }
W=$(ls "$T"/wheel/kvpool-*-cp38-abi3-*.whl 2>/dev/null | head -1)
[ -n "$W" ] || fail "no cp38-abi3 wheel in $T/wheel: $(ls "$T/wheel")"
LIST=$("$PY" -m zipfile -l "$W")
grep -q 'kvpool/_kvpool.abi3.so' <<<"$LIST" || fail "wheel without the extension"
grep -q 'kvpool/__init__.py' <<<"$LIST" || fail "wheel without __init__.py"
! grep -q 'mooncake' <<<"$LIST" || fail "the wheel must not ship the mooncake alias"
mkdir "$T/unpacked" && "$PY" -m zipfile -e "$W" "$T/unpacked"
(cd "$T" && PYTHONPATH="$T/unpacked" "$PY" -c 'import kvpool; s = kvpool.MooncakeDistributedStore(); assert s.put("k", b"v") == -600; print("wheel:", kvpool.__file__)') \
  || fail "import from the wheel"
rm -rf "$SRC/python/build" "$SRC/python/kvpool.egg-info"
echo PASS
