#!/usr/bin/env bash
# Sigstore's cosign client from Debian trixie (2.5), beside the system's packages without
# replacing them, for the tests that check imgbuild's signatures with the real client and
# imgbuild's verification against what the real client signs (tests/test_sign_interop.py).
# Installed as scripts/engines.sh installs Engine 26: `apt-get download` through a private apt
# (its own sources, lists and cache), `dpkg-deb -x` into $STATE/cosign/cosign-<version>, and a
# link $STATE/cosign/bin/cosign to the binary once it ran here. imgbuild itself never needs it.
#
# Called by scripts/services.sh; idempotent. A machine where this cannot be done (no network to
# Debian, a binary that does not run here) says why and exits 0; the tests skip, saying so.
set -uo pipefail

STATE="${IMGBUILD_STATE:-/var/lib/imgbuild}"
DIR="$STATE/cosign"
MIRROR="${IMGBUILD_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
say() { printf '[cosign] %s\n' "$*" >&2; }
give_up() { say "$*; the cosign interop tests will be skipped (everything else runs)"; exit 0; }

if [ -x "$DIR/bin/cosign" ] && "$DIR/bin/cosign" version >/dev/null 2>&1; then
  say "cosign $("$DIR/bin/cosign" version 2>/dev/null | sed -n 's/^GitVersion: *//p') already in $DIR/bin"
  exit 0
fi
for tool in apt-get dpkg-deb; do command -v "$tool" >/dev/null || give_up "cosign needs $tool"; done

src="$DIR/src"
rm -rf "$src/debs"
mkdir -p "$src/lists/partial" "$src/cache/archives/partial" "$src/parts" "$src/debs"
printf 'Types: deb\nURIs: %s\nSuites: trixie\nComponents: main\nSigned-By: %s\n' \
  "$MIRROR" /usr/share/keyrings/debian-archive-keyring.gpg > "$src/parts/trixie.sources"
o=(-o "Dir::Etc::SourceParts=$src/parts" -o Dir::Etc::SourceList=/dev/null
   -o "Dir::State::Lists=$src/lists" -o "Dir::Cache=$src/cache"
   -o Acquire::Retries=1 -o Acquire::http::Timeout=20)
[ "$(id -u)" = 0 ] && o+=(-o APT::Sandbox::User=root)
say "downloading cosign from Debian trixie ($MIRROR)"
timeout 300 apt-get "${o[@]}" update -qq --error-on=any >"$src/apt.log" 2>&1 ||
  give_up "apt-get update for trixie failed (no network to Debian?): $(tail -2 "$src/apt.log" | tr '\n' ' ')"
(cd "$src/debs" && timeout 300 apt-get "${o[@]}" download cosign) >>"$src/apt.log" 2>&1 ||
  give_up "apt-get download cosign from trixie failed: $(tail -2 "$src/apt.log" | tr '\n' ' ')"
version=$(dpkg-deb -f "$src/debs"/cosign_*.deb Version 2>/dev/null)
root="$DIR/cosign-${version//[:~]/_}"
tmp="$root.tmp"
rm -rf "$tmp"; mkdir -p "$tmp"
dpkg-deb -x "$src/debs"/cosign_*.deb "$tmp" || give_up "dpkg-deb -x cosign failed"
# A static Go binary: it runs here or it does not.
"$tmp/usr/bin/cosign" version >/dev/null 2>&1 || { rm -rf "$tmp"; give_up "trixie's cosign $version does not run here"; }
rm -rf "$root"; mv "$tmp" "$root"
mkdir -p "$DIR/bin"
ln -sfn "$root/usr/bin/cosign" "$DIR/bin/cosign.tmp" && mv -T "$DIR/bin/cosign.tmp" "$DIR/bin/cosign"
rm -rf "$src/debs" "$src/cache/archives"/*.deb
say "installed cosign $version in $DIR/bin/cosign"
