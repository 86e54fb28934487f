#!/usr/bin/env bash
# The Debian package, built by CPack from this build tree as scripts/package does, holds
# the programs, units, default config, model, docs and maintainer scripts at their
# Debian paths (`dpkg-deb -c`, `dpkg-deb -I`).
# Usage: test_package.sh BUILD_DIR
set -euo pipefail
build="$1"
tmp="$(mktemp -d /tmp/colibri-package-XXXXXX)"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
command -v dpkg-deb >/dev/null || fail "dpkg-deb not found"

cpack --config "$build/CPackConfig.cmake" -B "$tmp" >"$tmp/cpack.log" 2>&1 || { cat "$tmp/cpack.log" >&2; fail "cpack"; }
deb="$(ls "$tmp"/colibri_*.deb)"
dpkg-deb -c "$deb" | awk '{print $1, $6}' >"$tmp/contents"
expect() { # MODE PATH
  grep -qx -- "$1 $2" "$tmp/contents" || fail "$2 ($1) is not in the package:
$(cat "$tmp/contents")"
}
expect -rwxr-xr-x ./usr/bin/colibrid
expect -rwxr-xr-x ./usr/bin/colibri-worker
expect -rwxr-xr-x ./usr/bin/colibri-client
expect -rwxr-xr-x ./usr/bin/colibri
expect -rwxr-xr-x ./usr/bin/colibri-convert
expect -rw-r--r-- ./usr/lib/systemd/system/colibrid.service
expect -rw-r--r-- ./usr/lib/systemd/system/colibrid.socket
expect -rw-r--r-- ./usr/lib/systemd/system/colibrid-http.socket
expect -rw-r--r-- ./usr/lib/systemd/user/colibrid.service
expect -rw-r--r-- ./usr/lib/systemd/user/colibrid.socket
expect -rw-r--r-- ./usr/lib/systemd/user/colibrid-http.socket
expect -rw-r--r-- ./usr/lib/sysusers.d/colibri.conf
expect -rw-r--r-- ./etc/colibri/colibrid.conf
expect -rw-r--r-- ./usr/share/colibri/models/default.colibri
expect -rw-r--r-- ./usr/share/doc/colibri/operations.md
expect -rw-r--r-- ./usr/share/doc/colibri/colibrid.conf.default
if grep -q "_CPack_Packages\|/tmp/" "$tmp/contents"; then fail "staging paths leaked into the package"; fi

dpkg-deb -I "$deb" >"$tmp/info"
for f in postinst prerm postrm conffiles; do
  grep -q " $f\$" "$tmp/info" || grep -qE "^ +[0-9]+ bytes, +[0-9]+ lines +\*? *$f" "$tmp/info" || fail "no $f in the package"
done
grep -q "^ Package: colibri$" "$tmp/info" || fail "package name"
grep -q "^ Depends:.*passwd" "$tmp/info" || fail "Depends lacks passwd"
grep -q "^ Depends:.*libboost-program-options" "$tmp/info" || fail "Depends lacks the shared libraries (dpkg-shlibdeps)"

mkdir "$tmp/x"
dpkg-deb -x "$deb" "$tmp/x"
dpkg-deb -e "$deb" "$tmp/x/DEBIAN"
grep -qx "ExecStart=/usr/bin/colibrid --config /etc/colibri/colibrid.conf --socket /run/colibri/colibri.sock --socket-group colibri" \
  "$tmp/x/usr/lib/systemd/system/colibrid.service" || fail "the packaged unit does not run /usr/bin/colibrid with /etc/colibri"
grep -qx "model = /usr/share/colibri/models/default.colibri" "$tmp/x/etc/colibri/colibrid.conf" || fail "packaged config model"
grep -qx "/etc/colibri/colibrid.conf" "$tmp/x/DEBIAN/conffiles" || fail "the config is not a conffile"
grep -q "useradd --system" "$tmp/x/DEBIAN/postinst" || fail "postinst does not create the service user"
[ -x "$tmp/x/DEBIAN/postinst" ] || fail "postinst is not executable"
sh -n "$tmp/x/DEBIAN/postinst" && sh -n "$tmp/x/DEBIAN/prerm" && sh -n "$tmp/x/DEBIAN/postrm"
echo "ok: $(basename "$deb")"
