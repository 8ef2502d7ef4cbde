#!/usr/bin/env bash
# Installs and starts what imgbuild and its tests need on a fresh Debian-like machine, as root:
# uv, Debian's docker.io (dockerd + the 20.10 client with BuildKit built in), docker-registry
# (CNCF distribution) on 127.0.0.1:5000, debootstrap, containerd's ctr and Chromium (for the
# tests), and Docker Engine 26 beside the system's (scripts/engines.sh). Reuses whatever
# already runs.
set -euo pipefail

REGISTRY_ADDR="${IMGBUILD_REGISTRY_ADDR:-127.0.0.1:5000}"
STATE="${IMGBUILD_STATE:-/var/lib/imgbuild}"
say() { printf '[services] %s\n' "$*" >&2; }

if [ "$(id -u)" != 0 ]; then
  say "needs root (apt-get, dockerd, debootstrap); run: sudo make setup"; exit 3
fi

need=()
command -v dockerd >/dev/null || need+=(docker.io)
[ -x /usr/bin/docker ] || need+=(docker.io)
command -v docker-registry >/dev/null || need+=(docker-registry)
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v curl >/dev/null || need+=(curl)
# containerd's ctr: the tests pull images as a Kubernetes node does (docker.io brings it too).
command -v ctr >/dev/null || need+=(containerd)
# The compatibility page's test opens it in headless Chromium.
command -v chromium >/dev/null || need+=(chromium)
# Another apt (a machine's own updates at boot) may hold dpkg's lock: wait for it rather than fail.
apt_install() {
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
    --no-install-recommends "$@" >/dev/null
}
if [ ${#need[@]} -gt 0 ]; then
  say "installing ${need[*]} from Debian"
  apt-get -o DPkg::Lock::Timeout=600 update -qq
  apt_install "${need[@]}"
fi

# QEMU user emulation, for bases and checks of another CPU (arm64 on x86_64): registered with
# binfmt_misc's F flag so that it works inside chroots and containers. A machine that cannot
# register it still runs everything else; `imgbuild base bootstrap --cpu-arch` says what is
# missing.
if [ ! -e /usr/lib/binfmt.d/qemu-aarch64.conf ] && [ "$(uname -m)" != aarch64 ]; then
  say "installing qemu-user-static from Debian"
  apt_install qemu-user-static || true
fi
if [ "$(uname -m)" != aarch64 ] && [ -e /usr/lib/binfmt.d/qemu-aarch64.conf ] && \
   [ ! -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]; then
  [ -e /proc/sys/fs/binfmt_misc/register ] || \
    mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc 2>/dev/null || true
  grep -v '^#' /usr/lib/binfmt.d/qemu-aarch64.conf | head -n1 > /proc/sys/fs/binfmt_misc/register \
    2>/dev/null || say "could not register QEMU for aarch64 (binfmt_misc): arm64 bases cannot be made here"
fi

if ! command -v uv >/dev/null; then
  say "installing uv from PyPI"
  python3 -m pip install -q uv
fi

mkdir -p "$STATE"
if ! /usr/bin/docker info >/dev/null 2>&1; then
  say "starting dockerd (log: $STATE/dockerd.log)"
  setsid nohup dockerd >"$STATE/dockerd.log" 2>&1 < /dev/null &
  for _ in $(seq 1 60); do /usr/bin/docker info >/dev/null 2>&1 && break; sleep 0.5; done
  /usr/bin/docker info >/dev/null 2>&1 || { say "dockerd did not come up:"; tail -20 "$STATE/dockerd.log" >&2; exit 3; }
fi

if ! curl -fsS "http://$REGISTRY_ADDR/v2/" >/dev/null 2>&1; then
  say "starting docker-registry on $REGISTRY_ADDR (data: $STATE/registry)"
  mkdir -p "$STATE/registry"
  cat >"$STATE/registry.yml" <<YML
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $STATE/registry
  delete:
    enabled: true
http:
  addr: $REGISTRY_ADDR
YML
  setsid nohup docker-registry serve "$STATE/registry.yml" >"$STATE/registry.log" 2>&1 < /dev/null &
  for _ in $(seq 1 40); do curl -fsS "http://$REGISTRY_ADDR/v2/" >/dev/null 2>&1 && break; sleep 0.25; done
  curl -fsS "http://$REGISTRY_ADDR/v2/" >/dev/null || { say "registry did not come up:"; tail -20 "$STATE/registry.log" >&2; exit 3; }
fi
# Docker Engine 26 beside the system's 20.10, from Debian trixie, without replacing it: two
# daemons of its own (the classic image store and the containerd image store), on which the
# tests run the core path (tests/test_engines.py). A machine that cannot have them (no network
# to Debian) still runs everything else; those tests skip, saying so.
bash "$(dirname "$0")/engines.sh" || say "Engine 26 was not started (scripts/engines.sh failed); its tests will be skipped"
# Sigstore's cosign 2.5 from Debian trixie, beside the system's: the tests check imgbuild's
# signatures with the real client, in both directions. Without it those tests skip, saying so.
bash "$(dirname "$0")/cosign.sh" || say "cosign was not installed (scripts/cosign.sh failed); its tests will be skipped"

say "ready: dockerd $(/usr/bin/docker version --format '{{.Server.Version}}'), registry http://$REGISTRY_ADDR, $(uv --version)"
