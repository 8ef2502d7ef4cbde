#!/usr/bin/env bash
# Docker Engine 26 beside the system's (Debian bookworm's 20.10), for the tests that run the
# core path on three Engines (tests/test_engines.py): installed from Debian trixie's packages
# into a directory of its own, without touching the system's apt state or packages, and two
# persistent daemons started from it, each with its own data root, exec root, socket, bridge,
# NAT rules and log:
#
#   26-classic      the classic image store (overlay2)
#   26-containerd   the containerd image store ({"features": {"containerd-snapshotter": true}},
#                   Engine 29's and Docker Desktop's default)
#
# For each it writes $STATE/engines/<name>.env (DOCKER_HOST, IMGBUILD_DOCKER, DOCKER_CONFIG with
# the buildx plugin), so that `set -a; . $STATE/engines/26-classic.env; set +a; imgbuild ...`
# runs imgbuild against it; and $STATE/engines/26-client.env: the 26 client (with buildx)
# against the system's 20.10 Engine, a client newer than its server.
#
# Called by scripts/services.sh; idempotent (reuses the install and the daemons that answer).
# A machine where this cannot be done (not root, no network to Debian, a binary that does not
# run here) still runs everything else: it says why and exits 0; the tests skip, saying so.
set -uo pipefail

STATE="${IMGBUILD_STATE:-/var/lib/imgbuild}"
ENGINES="$STATE/engines"
# Another IMGBUILD_STATE is another pair of daemons: its runtime directory, bridges and cgroups
# carry a tag of its own.
TAG=""
[ "$STATE" = /var/lib/imgbuild ] || TAG=$(printf %s "$STATE" | md5sum | cut -c1-6)
# Runtime state (containerd's sockets): a short path, a unix socket's is limited to 108 bytes.
RUN_DIR="/run/imgbuild-engines${TAG:+-$TAG}"
CGROUP="imgbuild-engines${TAG:+-$TAG}"
MIRROR="${IMGBUILD_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
CPUACCT=/sys/fs/cgroup/cpuacct
PACKAGES=(docker.io docker-cli docker-buildx containerd tini)
# Trixie's runc and tini (dynamic) need GLIBC_2.38: the system's runc serves, and docker-init
# is trixie's tini-static.
DROP=(usr/sbin/runc usr/bin/runc usr/bin/tini)
say() { printf '[engines] %s\n' "$*" >&2; }
give_up() { say "$*; the tests on Engine 26 will be skipped (everything else runs)"; exit 0; }

if [ "$(id -u)" != 0 ]; then give_up "Engine 26 needs root (dockerd, bridges, iptables)"; fi
for tool in apt-get dpkg-deb ip iptables; do
  command -v "$tool" >/dev/null || give_up "Engine 26 needs $tool"
done
[ -x /usr/sbin/runc ] || command -v runc >/dev/null || give_up "Engine 26 needs runc (Debian's runc)"
mkdir -p "$ENGINES" "$RUN_DIR"

# --- the install ------------------------------------------------------------------------------

# A tree is complete once its binaries ran here and .complete was written last.
runs_here() {
  local root=$1
  "$root/usr/sbin/dockerd" --version >/dev/null 2>&1 &&
    "$root/usr/bin/containerd" --version >/dev/null 2>&1 &&
    "$root/usr/bin/containerd-shim-runc-v2" -v >/dev/null 2>&1 &&
    "$root/usr/bin/docker" --version >/dev/null 2>&1 &&
    "$root/usr/libexec/docker/cli-plugins/docker-buildx" version >/dev/null 2>&1 &&
    "$root/usr/bin/docker-init" --version >/dev/null 2>&1 &&
    "$root/usr/sbin/docker-proxy" -h >/dev/null 2>&1
}

installed() {  # the newest complete tree, if any
  local d
  for d in $(ls -d "$ENGINES"/docker-*/ 2>/dev/null | sort -rV); do
    d=${d%/}
    if [ -e "$d/.complete" ] && runs_here "$d"; then echo "$d"; return 0; fi
  done
  return 1
}

install() {
  local src="$ENGINES/src" o version upstream root tmp deb
  rm -rf "$src/debs"
  mkdir -p "$src/lists/partial" "$src/cache/archives/partial" "$src/parts" "$src/debs"
  printf 'Types: deb\nURIs: %s\nSuites: trixie\nComponents: main\nSigned-By: %s\n' \
    "$MIRROR" /usr/share/keyrings/debian-archive-keyring.gpg > "$src/parts/trixie.sources"
  # A private apt: its own sources, lists and cache; the system's are not read or written.
  o=(-o "Dir::Etc::SourceParts=$src/parts" -o Dir::Etc::SourceList=/dev/null
     -o "Dir::State::Lists=$src/lists" -o "Dir::Cache=$src/cache"
     -o Acquire::Retries=1 -o Acquire::http::Timeout=20 -o APT::Sandbox::User=root)
  say "downloading Docker Engine 26 from Debian trixie ($MIRROR): ${PACKAGES[*]}"
  if ! timeout 300 apt-get "${o[@]}" update -qq --error-on=any >"$src/apt.log" 2>&1; then
    give_up "apt-get update for trixie failed (no network to Debian?): $(tail -2 "$src/apt.log" | tr '\n' ' ')"
  fi
  if ! (cd "$src/debs" && timeout 600 apt-get "${o[@]}" download "${PACKAGES[@]}") \
      >>"$src/apt.log" 2>&1; then
    give_up "apt-get download from trixie failed: $(tail -2 "$src/apt.log" | tr '\n' ' ')"
  fi
  version=$(dpkg-deb -f "$src/debs"/docker.io_*.deb Version 2>/dev/null)
  upstream=${version#*:}; upstream=${upstream%%-*}; upstream=${upstream%%+*}
  # Trixie's, not the system's own (apt falls back on the installed version where its lists
  # lack the package).
  [ "${upstream%%.*}" -ge 23 ] 2>/dev/null ||
    give_up "apt-get download gave docker.io ${version:-nothing}, not trixie's Engine 26"
  root="$ENGINES/docker-$upstream"
  tmp="$root.tmp"
  rm -rf "$tmp"; mkdir -p "$tmp"
  for deb in "$src/debs"/*.deb; do dpkg-deb -x "$deb" "$tmp" || give_up "dpkg-deb -x $deb failed"; done
  for f in "${DROP[@]}"; do rm -f "$tmp/$f"; done
  if ! runs_here "$tmp"; then
    rm -rf "$tmp"
    give_up "trixie's Docker $version does not run on this machine"
  fi
  printf 'docker.io %s\n' "$version" > "$tmp/.complete"
  for deb in "$src/debs"/*.deb; do dpkg-deb -f "$deb" Package Version | paste -sd' '; done \
    >> "$tmp/.complete"
  rm -rf "$root"; mv "$tmp" "$root"
  rm -rf "$src/debs" "$src/cache/archives"/*.deb
  say "installed Docker $version in $root"
  echo "$root"
}

ROOT=$(installed) || ROOT=$(install) || exit 0
[ -n "$ROOT" ] || exit 0
DOCKER="$ROOT/usr/bin/docker"
VERSION=$("$DOCKER" --version | sed -E 's/^Docker version ([^,+]*).*/\1/')

# A DOCKER_CONFIG that holds the buildx plugin (clients from 23 build through it).
docker_config() {
  local dir="$ENGINES/$1/docker-config"
  mkdir -p "$dir/cli-plugins"
  ln -sfn "$ROOT/usr/libexec/docker/cli-plugins/docker-buildx" "$dir/cli-plugins/docker-buildx"
  echo "$dir"
}

write_env() {  # name, what, DOCKER_HOST, DOCKER_CONFIG
  local tmp="$ENGINES/$1.env.tmp"
  cat >"$tmp" <<ENV
# $2. Use: set -a; . $ENGINES/$1.env; set +a
DOCKER_HOST=$3
IMGBUILD_DOCKER=$DOCKER
DOCKER_CONFIG=$4
ENV
  mv "$tmp" "$ENGINES/$1.env"
}

# --- the daemons ------------------------------------------------------------------------------

# A free 172.30.x.0/24 for a bridge, outside tests/fresh_engine.py's 200-249; the one chosen
# before is kept (in <dir>/subnet) while nothing else took it.
free_subnet() {
  local dir=$1 bridge=$2 used third net
  used=$(ip -4 route; ip -4 -o addr)
  if [ -s "$dir/subnet" ]; then
    net=$(cat "$dir/subnet")
    if ! grep -v " $bridge " <<<"$used" | grep -q "${net%.0/24}\."; then echo "$net"; return 0; fi
  fi
  for third in $(seq 100 199); do
    net="172.30.$third.0/24"
    grep -q "172\.30\.$third\." <<<"$used" && continue
    grep -qs "^$net\$" "$ENGINES"/*/subnet && continue  # another engine's, while it is down
    echo "$net" > "$dir/subnet"; echo "$net"; return 0
  done
  return 1
}

answers() { DOCKER_CONFIG="$2" timeout 20 "$DOCKER" -H "$1" version --format '{{.Server.Version}}' 2>/dev/null; }

start_engine() {  # name, containerd store (true|false), bridge
  local name=$1 snapshotter=$2 bridge=$3
  local dir="$ENGINES/$name" exec="$RUN_DIR/$name" sock host config net gateway store
  mkdir -p "$dir" "$exec"
  sock="$dir/docker.sock"
  [ ${#sock} -lt 100 ] || sock="$RUN_DIR/$name.sock"
  host="unix://$sock"
  config=$(docker_config "$name")
  store="classic store (overlay2)"
  $snapshotter && store="containerd image store"
  if [ -n "$(answers "$host" "$config")" ]; then
    say "$name: Docker Engine $(answers "$host" "$config"), $store, already runs on $host"
  else
    rm -f "$ENGINES/$name.env"
    net=$(free_subnet "$dir" "$bridge") || { say "$name: no free 172.30.x.0/24 for its bridge"; return 0; }
    gateway="${net%.0/24}.1/24"
    if ! ip link show "$bridge" >/dev/null 2>&1; then
      ip link add name "$bridge" type bridge || { say "$name: cannot add bridge $bridge"; return 0; }
    fi
    ip -4 addr show dev "$bridge" | grep -q "inet $gateway " || {
      ip addr flush dev "$bridge"; ip addr add "$gateway" dev "$bridge"; }
    ip link set "$bridge" up
    # NAT and forwarding of its own: the daemon is told to leave iptables alone, so the shared
    # Engine's rules stay as they are (as tests/fresh_engine.py does).
    iptables -t nat -C POSTROUTING -s "$net" ! -o "$bridge" -j MASQUERADE 2>/dev/null ||
      iptables -t nat -A POSTROUTING -s "$net" ! -o "$bridge" -j MASQUERADE
    iptables -C FORWARD -i "$bridge" -j ACCEPT 2>/dev/null ||
      iptables -I FORWARD -i "$bridge" -j ACCEPT
    iptables -C FORWARD -o "$bridge" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT 2>/dev/null ||
      iptables -I FORWARD -o "$bridge" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
    printf '{"features": {"containerd-snapshotter": %s}}\n' "$snapshotter" > "$dir/daemon.json"
    say "$name: starting Docker Engine $VERSION, $store, on $host, bridge $bridge $net (log: $dir/dockerd.log)"
    # Where cgroup v1's cpuacct is (as here), the daemon, its containerd and shims, and its
    # containers and build steps (--cgroup-parent) go in a cgroup of their own, whose
    # cpuacct.usage is this Engine's CPU time alone (tests/test_engines.py reports it per step);
    # elsewhere (cgroup v2, the systemd driver) the Engine's defaults.
    local cgroup=() enter=""
    if [ -d "$CPUACCT" ] && mkdir -p "$CPUACCT/$CGROUP/$name/daemon" 2>/dev/null; then
      cgroup=(--cgroup-parent "/$CGROUP/$name")
      enter="$CPUACCT/$CGROUP/$name/daemon/cgroup.procs"
    fi
    # Its PATH first: trixie's containerd (1.7) as the daemon's managed containerd, its shim,
    # docker-proxy and docker-init; the system's runc.
    PATH="$ROOT/usr/sbin:$ROOT/usr/bin:$PATH" ENTER="$enter" setsid nohup sh -c \
      '[ -z "$ENTER" ] || echo $$ > "$ENTER" || true; exec "$@"' dockerd \
      "$ROOT/usr/sbin/dockerd" \
      --config-file "$dir/daemon.json" --data-root "$dir/data" --exec-root "$exec" \
      --pidfile "$dir/dockerd.pid" -H "$host" --bridge "$bridge" "${cgroup[@]}" \
      --iptables=false --ip-masq=false --ip-forward=false \
      >>"$dir/dockerd.log" 2>&1 </dev/null &
    for _ in $(seq 1 120); do [ -n "$(answers "$host" "$config")" ] && break; sleep 0.5; done
    if [ -z "$(answers "$host" "$config")" ]; then
      say "$name: dockerd did not come up:"; tail -15 "$dir/dockerd.log" >&2; return 0
    fi
  fi
  # The store it runs is the one its name says.
  local driver
  driver=$(DOCKER_CONFIG="$config" "$DOCKER" -H "$host" info --format '{{json .DriverStatus}}' 2>/dev/null)
  if $snapshotter && ! grep -q 'io.containerd.snapshotter' <<<"$driver"; then
    say "$name: runs without the containerd image store ($driver); not used"; return 0
  fi
  if ! $snapshotter && grep -q 'io.containerd.snapshotter' <<<"$driver"; then
    say "$name: runs the containerd image store; not used"; return 0
  fi
  write_env "$name" "Docker Engine $VERSION, $store, beside the system's" "$host" "$config"
}

# Bridge names: at most 15 characters.
if [ -z "$TAG" ]; then
  start_engine 26-classic false ibe26classic
  start_engine 26-containerd true ibe26ctrd
else
  start_engine 26-classic false "ib26cl$TAG"
  start_engine 26-containerd true "ib26cd$TAG"
fi
write_env 26-client "The Docker $VERSION client (buildx) against the system's Engine" \
  "unix:///var/run/docker.sock" "$(docker_config 26-client)"
say "ready: $(ls "$ENGINES"/*.env 2>/dev/null | xargs -rn1 basename | tr '\n' ' ')in $ENGINES"
