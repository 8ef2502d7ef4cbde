"""Which Docker Engine imgbuild has, and what it does with it.

Three kinds are in use: Debian bookworm's 20.10 (classic store; its 20.10 client has BuildKit
built in, DOCKER_BUILDKIT=1), Engine 26 with the classic store (overlay2) and buildx, and
Engine 26 and later with the containerd image store (the default of Engine 29 and of Docker
Desktop from 4.34). What differs between them, measured (tests/fixtures/engines/README.md):
what `docker save` writes, what the image id is the digest of, which build cache BuildKit's
docker driver can export, whether the build's timestamps follow SOURCE_DATE_EPOCH, whether the
Engine pulls zstd layers.

`read_facts` asks the daemon and the client once; `facts_from` and `decide` are pure, fed with
the recorded outputs in the tests. A caller that needs the facts twice keeps them: nothing
here is remembered between calls.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import asdict, dataclass

from ..errors import EXIT_ENV, EXIT_OK, EnvError
from . import daemon
from .daemon import DockerCLI

# `docker info` DriverStatus under the containerd image store: ["driver-type", this].
SNAPSHOTTER = "io.containerd.snapshotter.v1"
# The classic store's graph drivers (DriverStatus holds no driver-type under them).
GRAPH_DRIVERS = frozenset({"overlay2", "fuse-overlayfs", "btrfs", "zfs", "vfs", "devicemapper",
                           "aufs", "overlay", "windowsfilter"})

MIN_API = (1, 41)  # Engine 20.10: the oldest imgbuild builds with
BUILDX_CLIENT = (23, 0)  # clients from 23 build with BuildKit only through the buildx plugin
ZSTD_PULL = (23, 0)  # the Engine unpacks zstd layers (20.10: "archive/tar: invalid tar header")
SOURCE_DATE_EPOCH = (24, 0)  # BuildKit 0.11: the config's created time and history take it
OCI_SAVE = (25, 0)  # the classic store's `docker save` writes an OCI layout
REWRITE_TIMESTAMP = (26, 0)  # BuildKit 0.13: the exporter option rewrite-timestamp


def release(version: str | None) -> tuple[int, int]:
    """"26.1.5+dfsg1" -> (26, 1); "1.45" -> (1, 45); (0, 0) when it says no number."""
    m = re.match(r"v?(\d+)\.(\d+)", version or "")
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


@dataclass(frozen=True)
class EngineFacts:
    """What the daemon and the client say about themselves."""

    host: str  # DOCKER_HOST, or the default socket
    product: str  # "Docker Engine"; another product answering the same API is named here
    version: str  # the Engine's: "26.1.5+dfsg1"
    api_version: str  # "1.45"
    store: str  # "classic" | "containerd" | "unknown"
    storage_driver: str  # "overlay2" (classic), "overlayfs" (a containerd snapshotter)
    driver_type: str | None  # DriverStatus' driver-type (io.containerd.snapshotter.v1), if any
    platform: str  # the Engine's OS/arch: "linux/amd64"
    operating_system: str  # "Debian GNU/Linux 12 (bookworm)"
    client_path: str
    client_version: str
    buildkit_env: bool  # the client builds with DOCKER_BUILDKIT=1 (client < 23)
    buildx_version: str | None  # the buildx plugin's, when the client builds through it
    buildx_driver: str | None  # its current builder's driver: "docker"
    builder: str  # in words: "BuildKit built into client 20.10.24+dfsg1 (DOCKER_BUILDKIT=1)"

    @property
    def release(self) -> tuple[int, int]:
        return release(self.version)

    @property
    def buildx(self) -> bool:
        """The build goes through buildx (which alone passes --cache-to and exporter options)."""
        return not self.buildkit_env and self.buildx_version is not None

    def to_dict(self) -> dict:
        return asdict(self)


def _server(version: dict) -> dict:
    """The Engine's part of `docker version` (the CLI's JSON) or of the API's /version."""
    return version.get("Server") or version


def _product(server: dict) -> str:
    names = [c.get("Name") for c in server.get("Components") or []]
    return "Docker Engine" if not names or "Engine" in names else str(names[0])


def _store(info: dict, product: str) -> tuple[str, str | None]:
    status = dict(p for p in info.get("DriverStatus") or [] if len(p) == 2)
    driver_type = status.get("driver-type")
    if product != "Docker Engine":
        return "unknown", driver_type
    if driver_type == SNAPSHOTTER:
        return "containerd", driver_type
    if driver_type is None and info.get("Driver") in GRAPH_DRIVERS:
        return "classic", None
    return "unknown", driver_type


def _builder(cli: DockerCLI, buildx_version: str | None, buildx_driver: str | None) -> str:
    if cli.buildkit_env:
        return f"BuildKit built into client {cli.version} (DOCKER_BUILDKIT=1)"
    if buildx_version is None:
        return f"none: client {cli.version} has no buildx plugin"
    return f"buildx {buildx_version}, " + (f"{buildx_driver} driver" if buildx_driver
                                            else "driver unknown")


def facts_from(info: dict, version: dict, cli: DockerCLI, buildx_version: str | None,
               buildx_driver: str | None = None, *, host: str = "") -> EngineFacts:
    """The facts from `docker info` and `docker version` (the CLI's JSON or the API's), the
    client imgbuild builds with, and its buildx plugin's version (None: none, or not used)."""
    server = _server(version)
    product = _product(server)
    store, driver_type = _store(info, product)
    bx = None if cli.buildkit_env else buildx_version
    return EngineFacts(
        host=host, product=product,
        version=str(server.get("Version") or info.get("ServerVersion") or "?"),
        api_version=str(server.get("ApiVersion") or "?"),
        store=store, storage_driver=str(info.get("Driver") or "?"), driver_type=driver_type,
        platform=f"{server.get('Os') or info.get('OSType') or '?'}/"
                 f"{server.get('Arch') or info.get('Architecture') or '?'}",
        operating_system=str(info.get("OperatingSystem") or "?"),
        client_path=cli.path, client_version=cli.version, buildkit_env=cli.buildkit_env,
        buildx_version=bx, buildx_driver=buildx_driver if bx else None,
        builder=_builder(cli, bx, buildx_driver))


def buildx_version_from(text: str) -> str | None:
    """`docker buildx version`: "github.com/docker/buildx 0.13.1+ds1 0.13.1+ds1-3" ->
    "0.13.1+ds1" (Docker's builds say "v0.14.1 59582d7": "0.14.1")."""
    words = text.split()
    return words[1].removeprefix("v") if len(words) >= 2 else None


def buildx_driver_from(text: str) -> str | None:
    """`docker buildx inspect`: the current builder's "Driver:" line."""
    m = re.search(r"^Driver:\s*(\S+)", text, re.MULTILINE)
    return m.group(1) if m else None


def _buildx(path: str) -> tuple[str | None, str | None]:
    def run(*args: str) -> str | None:
        try:
            r = subprocess.run([path, "buildx", *args], capture_output=True, text=True,
                               timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return r.stdout if r.returncode == 0 else None

    said = run("version")
    if said is None:
        return None, None
    inspected = run("inspect")
    return buildx_version_from(said), buildx_driver_from(inspected or "")


def _docker_cli() -> DockerCLI:
    """The client imgbuild builds with; when none can (a client from 23 without buildx), the
    first it would have tried, so that the facts name it and decide() says why."""
    try:
        return daemon.cli()
    except EnvError:
        for path in daemon.candidates():
            ver = daemon.client_version(path)
            if ver:
                return DockerCLI(path, ver, False)
        raise


def read_facts(api=None, docker_cli: DockerCLI | None = None, *,
               host: str | None = None) -> EngineFacts:
    """Ask the daemon (the docker SDK's client: `api`, or daemon.client()) and the client
    (daemon.cli()). Raises EnvError when no daemon answers. host: where `api` points, for the
    report (default: DOCKER_HOST, as daemon.client() reads it)."""
    api = api if api is not None else daemon.client()
    docker_cli = docker_cli or _docker_cli()
    bx_version, bx_driver = (None, None) if docker_cli.buildkit_env else _buildx(docker_cli.path)
    return facts_from(api.info(), api.version(), docker_cli, bx_version, bx_driver,
                      host=host or os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock"))


# --- what imgbuild does with it ---------------------------------------------------------------

@dataclass(frozen=True)
class Decision:
    value: str | bool
    why: str


@dataclass(frozen=True)
class Refusal:
    """Why imgbuild cannot build and publish with this Engine, and the way out."""

    message: str
    facts: tuple[str, ...]
    hints: tuple[str, ...]

    def error(self) -> EnvError:
        return EnvError(self.message, facts=list(self.facts), hint="; or ".join(self.hints))

    def to_dict(self) -> dict:
        return self.error().to_dict()


@dataclass(frozen=True)
class EngineUse:
    # "unknown" for the first three under a store imgbuild does not know (which it refuses)
    save: Decision  # how the push reads the image: "legacy" | "oci" | "oci-compressed"
    image_id: Decision  # what the image id is the digest of: "config" | "manifest"
    cache: Decision  # the build cache the build exports: "registry" | "inline" | "none"
    source_date_epoch: Decision  # the config's created time and history take it
    rewrite_timestamp: Decision  # the layers' file times are rewritten to it
    zstd: Decision  # the Engine pulls images with zstd layers
    publish: Decision  # imgbuild builds and publishes with this Engine
    refusal: Refusal | None = None

    @property
    def publishable(self) -> bool:
        return self.refusal is None

    @property
    def exit_code(self) -> int:
        return EXIT_OK if self.refusal is None else EXIT_ENV

    def decisions(self) -> dict[str, Decision]:
        return {k: v for k, v in self.__dict__.items() if isinstance(v, Decision)}

    def to_dict(self) -> dict:
        return {"use": {k: asdict(v) for k, v in self.decisions().items()},
                "publishable": self.publishable,
                "refusal": self.refusal.to_dict() if self.refusal else None}


# Under a store imgbuild does not know, it says nothing of what that store does (and refuses).
UNKNOWN = Decision("unknown", "an image store imgbuild does not know")


def _save(f: EngineFacts) -> Decision:
    if f.store == "unknown":
        return UNKNOWN
    if f.store == "containerd":
        return Decision("oci-compressed", "the containerd store's `docker save` writes an OCI "
                        "layout whose layers are the compressed blobs, named by their "
                        "compressed digest, not by diff id")
    if f.release >= OCI_SAVE:
        return Decision("oci", f"the classic store's `docker save` (Engine {f.version} >= 25) "
                        "writes an OCI layout with the layers uncompressed, named by diff id")
    return Decision("legacy", f"the classic store's `docker save` on Engine {f.version} (< 25) "
                    "writes the legacy layout, a <id>/layer.tar per layer: a layer's diff id is "
                    "known once it is hashed")


def _image_id(f: EngineFacts) -> Decision:
    if f.store == "unknown":
        return UNKNOWN
    if f.store == "containerd":
        return Decision("manifest", "under the containerd store the image id is the digest of "
                        "the image's index (or manifest), not of its config"
                        + ("; buildx adds a provenance attestation manifest to that index"
                           if f.buildx else ""))
    return Decision("config", "under the classic store the image id is the config's digest")


def _cache(f: EngineFacts) -> Decision:
    inline = "the image carries its own (inline) cache for the next build's --cache-from"
    if f.buildkit_env:
        return Decision("inline", f"client {f.client_version}'s `docker build` "
                        "(DOCKER_BUILDKIT=1) has no --cache-to: " + inline)
    if not f.buildx:
        return Decision("none", f"client {f.client_version} builds nothing without the buildx "
                        "plugin")
    if f.store == "unknown":
        return UNKNOWN
    if f.store == "classic":
        return Decision("inline", "BuildKit's docker driver exports no build cache under the "
                        "classic store (\"Cache export is not supported for the docker "
                        "driver\"): " + inline)
    return Decision("registry", "BuildKit's docker driver exports a registry cache under the "
                    "containerd store (--cache-to type=registry,mode=max: every stage's layers, "
                    "not only the final image's); imgbuild writes and reads it with "
                    "--registry-cache, and reads the images' inline cache by default: on "
                    "Engine 26.1.5 a fresh runner got less from it than from the inline cache "
                    "(bench/results/registry-cache-tiny-cpu.json)")


def _source_date_epoch(f: EngineFacts) -> Decision:
    if f.release >= SOURCE_DATE_EPOCH:
        return Decision(True, f"the Engine's BuildKit (Engine {f.version} >= 24, BuildKit >= "
                        "0.11) sets the image config's created time and history from it")
    return Decision(False, f"Engine {f.version} (< 24) has a BuildKit older than 0.11, which "
                    "ignores it: the config's created time is the build's")


def _rewrite_timestamp(f: EngineFacts) -> Decision:
    if f.release < REWRITE_TIMESTAMP:
        return Decision(False, f"it needs BuildKit >= 0.13 (Engine >= 26); Engine {f.version} "
                        "has an older one")
    if f.buildkit_env:
        return Decision(False, f"client {f.client_version}'s `docker build` cannot ask for it "
                        "(only buildx passes exporter options)")
    if f.store == "containerd":
        return Decision(True, "through BuildKit's OCI exporter, to an archive that is then "
                        "loaded into the Engine: the containerd store's own image exporter "
                        "unpacks the image and refuses it ('exporter option "
                        "\"rewrite-timestamp\" conflicts with \"unpack\"', moby/buildkit#4230), "
                        "the OCI exporter does not unpack")
    if f.store == "classic":
        return Decision(False, "the classic store's image exporter ignores it, without a word "
                        "(the layers' files keep their times), and its docker driver has no "
                        "OCI exporter")
    return UNKNOWN


def _zstd(f: EngineFacts) -> Decision:
    if f.release >= ZSTD_PULL:
        return Decision(True, f"Engine {f.version} (>= 23) pulls and unpacks zstd layers")
    return Decision(False, f"Engine {f.version} (< 23) downloads zstd layers and fails "
                    "\"archive/tar: invalid tar header\": pull gzip images here")


def _refusal(f: EngineFacts) -> Refusal | None:
    facts, hints = [], []
    if release(f.api_version) < MIN_API:
        facts.append(f"{f.product} {f.version} speaks API {f.api_version}: older than 20.10 "
                     "(API 1.41), the oldest Engine imgbuild builds with")
        hints.append("upgrade the Engine to 20.10 or later (Debian bookworm's docker.io is "
                     "20.10.24), or point DOCKER_HOST at one")
    if f.store == "unknown":
        what = f"Driver {f.storage_driver!r}" + (
            f", driver-type {f.driver_type!r}" if f.driver_type else "") + (
            f", answered by {f.product}" if f.product != "Docker Engine" else "")
        facts.append(f"its image store is neither Docker's classic store nor the containerd "
                     f"image store ({what}): imgbuild reads images through `docker save`, "
                     "whose layout is the store's")
        hints.append("use a Docker Engine with the classic store (overlay2) or the containerd "
                     "image store ({\"features\": {\"containerd-snapshotter\": true}}), or "
                     "point DOCKER_HOST at one")
    if not f.buildkit_env and f.buildx_version is None:
        facts.append(f"the docker client {f.client_path} ({f.client_version}) builds with "
                     "BuildKit only through the buildx plugin, which is missing")
        hints.append("install the buildx plugin (Debian: docker-buildx; Docker's packages: "
                     "docker-buildx-plugin), or set IMGBUILD_DOCKER to a 20.10 client, which "
                     "has BuildKit built in")
    if not facts:
        return None
    return Refusal(f"imgbuild cannot build and publish with {f.product} {f.version}"
                   + (f" at {f.host}" if f.host else ""), tuple(facts), tuple(hints))


def decide(f: EngineFacts) -> EngineUse:
    """What imgbuild does with this Engine and client, each with its reason."""
    refusal = _refusal(f)
    layout = {"legacy": "the legacy layout", "oci": "an OCI layout, layers uncompressed",
              "oci-compressed": "an OCI layout, layers compressed", "unknown": "?"}
    save = _save(f)
    publish = Decision(False, "; ".join(refusal.facts)) if refusal else Decision(
        True, f"it builds with {f.builder}; it pushes from `docker save` "
              f"({layout[str(save.value)]})")
    return EngineUse(save=save, image_id=_image_id(f), cache=_cache(f),
                     source_date_epoch=_source_date_epoch(f),
                     rewrite_timestamp=_rewrite_timestamp(f), zstd=_zstd(f), publish=publish,
                     refusal=refusal)


def require_publishable(facts: EngineFacts) -> EngineUse:
    """For a build that will push: refuse, before building, an Engine imgbuild cannot publish
    from (EnvError, exit 3, with the way out); otherwise what it will do with it."""
    use = decide(facts)
    if use.refusal is not None:
        raise use.refusal.error()
    return use
