#!/usr/bin/env bash
# `cmake --install` into a temporary prefix: the programs, units, config, model and docs
# land where they belong, the units name that prefix, and every unit (system and user)
# passes `systemd-analyze verify`.
# Usage: test_install.sh BUILD_DIR
set -euo pipefail
build="$1"
tmp="$(mktemp -d /tmp/colibri-install-XXXXXX)"
trap 'rm -rf "$tmp"' EXIT
prefix="$tmp/prefix"
fail() { echo "FAIL: $*" >&2; exit 1; }

cmake --install "$build" --prefix "$prefix" >"$tmp/install.log"

for f in bin/colibrid bin/colibri-worker bin/colibri-client bin/colibri bin/colibri-convert; do
  [ -x "$prefix/$f" ] || fail "$f is not installed"
done
for f in lib/systemd/system/colibrid.service lib/systemd/system/colibrid.socket lib/systemd/system/colibrid-http.socket \
         lib/systemd/user/colibrid.service lib/systemd/user/colibrid.socket lib/systemd/user/colibrid-http.socket \
         lib/sysusers.d/colibri.conf share/doc/colibri/http.md \
         etc/colibri/colibrid.conf share/colibri/models/default.colibri \
         share/doc/colibri/operations.md share/doc/colibri/protocol.md share/doc/colibri/README.md \
         share/doc/colibri/colibrid.conf.default; do
  [ -f "$prefix/$f" ] || fail "$f is not installed"
done

unit="$prefix/lib/systemd/system/colibrid.service"
grep -qx "ExecStart=$prefix/bin/colibrid --config $prefix/etc/colibri/colibrid.conf --socket /run/colibri/colibri.sock --socket-group colibri" "$unit" \
  || fail "system ExecStart does not name the install prefix: $(grep ExecStart= "$unit")"
grep -qx "ExecStart=$prefix/bin/colibrid --config $prefix/etc/colibri/colibrid.conf" "$prefix/lib/systemd/user/colibrid.service" \
  || fail "user ExecStart does not name the install prefix"
grep -qx "model = $prefix/share/colibri/models/default.colibri" "$prefix/etc/colibri/colibrid.conf" \
  || fail "the default config does not name the installed model"
if grep -q '@[A-Z_]*@' "$prefix"/lib/systemd/*/colibrid*; then fail "unsubstituted @VARIABLE@ in a unit"; fi
for d in Type=notify NotifyAccess=main Restart=on-failure WatchdogSec=30 RuntimeDirectory=colibri User=colibri \
         NoNewPrivileges=yes ProtectSystem=strict ProtectHome=yes PrivateTmp=yes RestrictAddressFamilies=AF_UNIX \
         LockPersonality=yes SystemCallArchitectures=native KillMode=mixed DevicePolicy=closed \
         "DeviceAllow=char-nvidia-uvm rw"; do
  grep -qx "$d" "$unit" || fail "the system service lacks $d"
done
grep -qx "ListenStream=/run/colibri/colibri.sock" "$prefix/lib/systemd/system/colibrid.socket" || fail "system socket path"
grep -qx "ListenStream=%t/colibri/colibri.sock" "$prefix/lib/systemd/user/colibrid.socket" || fail "user socket path"
for scope in system user; do
  http_unit="$prefix/lib/systemd/$scope/colibrid-http.socket"
  for d in ListenStream=127.0.0.1:8012 FileDescriptorName=http Service=colibrid.service; do
    grep -qx "$d" "$http_unit" || fail "the $scope HTTP socket lacks $d"
  done
done

# The installed default config is one colibrid accepts.
"$prefix/bin/colibrid" --config "$prefix/etc/colibri/colibrid.conf" --help >/dev/null

# A second install keeps an edited config.
echo "# edited" >>"$prefix/etc/colibri/colibrid.conf"
cmake --install "$build" --prefix "$prefix" >"$tmp/install2.log"
tail -n1 "$prefix/etc/colibri/colibrid.conf" | grep -qx "# edited" || fail "a reinstall overwrote the edited config"

command -v systemd-analyze >/dev/null || fail "systemd-analyze not found: install Debian's systemd package (scripts/deps)"
export SYSTEMD_LOG_COLOR=0
systemd-analyze verify --man=no "$prefix"/lib/systemd/system/colibrid.service "$prefix"/lib/systemd/system/colibrid.socket \
  "$prefix"/lib/systemd/system/colibrid-http.socket \
  >"$tmp/verify-system.log" 2>&1 || { cat "$tmp/verify-system.log" >&2; fail "systemd-analyze verify (system units)"; }
mkdir -m 0700 "$tmp/xdg" # a user manager needs a runtime directory
XDG_RUNTIME_DIR="$tmp/xdg" systemd-analyze --user verify --man=no "$prefix"/lib/systemd/user/colibrid.service "$prefix"/lib/systemd/user/colibrid.socket \
  "$prefix"/lib/systemd/user/colibrid-http.socket \
  >"$tmp/verify-user.log" 2>&1 || { cat "$tmp/verify-user.log" >&2; fail "systemd-analyze verify (user units)"; }
# verify exits 0 on some warnings; a unit of ours must not cause any.
if grep -i "colibrid" "$tmp"/verify-*.log; then fail "systemd-analyze verify warns about our units"; fi
echo "ok: installed to $prefix and verified 6 units"
