"""The Plan: one immutable value computed from the spec and the options.

Everything downstream (render, build, smoke, publish) reads the Plan and nothing else; its
content key (plan/key.py) hashes everything that determines the image's bytes, so the same
inputs always give the same content tag and an image is never built twice. plan/decide.py
makes it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ..catalog.targets import Override


@dataclass(frozen=True)
class Plan:
    target: str
    description: str
    engine: str
    engine_version: str
    model: str | None
    model_name: str | None
    checkpoint: str | None
    model_size_gb: float | None
    tensor_parallel: int | None
    serve_flags: tuple[str, ...]
    archs: tuple[str, ...]
    cpu_arch: str
    platform: str  # linux/amd64: this image's OCI platform
    # Every platform the target names: with more than one, this image is one manifest of an
    # OCI image index (plan/index.py), which carries the moving tags.
    index_platforms: tuple[str, ...]
    cuda: str | None
    min_driver: str | None
    selection: tuple[str, ...]  # why this CUDA and base: the reasoning `plan` shows
    base: str  # the OS key in images/bases.yaml
    base_image: str
    base_digest: str | None  # manifest digest, or a bootstrapped base's rootfs (None: a tag)
    spec_digest: str  # the target's spec, normalized (plan/decide.py)
    base_os: str
    flavor: str
    python: str
    python_packages: tuple[str, ...]
    platform_tag: str  # manylinux_2_36_x86_64: what wheels the image can take
    uv_platform: str  # the same, as uv's --python-platform spells it
    lock_path: str
    lock_hash: str
    lock_inputs: str
    lock_packages: int
    heavy_packages: tuple[str, ...]
    overrides: tuple[Override, ...]
    patches: tuple[str, ...]  # what the target lists
    applied_patches: tuple[str, ...]  # those that cover the locked version: the patch layer
    needed_patches: tuple[str, ...]  # every known patch that covers a locked version
    patch_digest: str | None  # the patch layer's files, by content (None: no patch layer)
    extra_index_urls: tuple[str, ...]
    smoke_model: str | None
    smoke_model_key: str | None
    repository: str
    forced: bool = False  # --force: moving tags move even if the smoke test fails
    # devel: the OS packages nvcc and cpp_extension need, and where the wheels' toolkit lies
    # in the image (CUDA_HOME), with the nvcc version the lock pins.
    devel_packages: tuple[str, ...] = ()
    cuda_home: str | None = None
    nvcc: str | None = None
    # Dead weight the flavor drops, by rule (images/prune.yaml): (kind, pattern) pairs.
    prune: tuple[tuple[str, str], ...] = ()
    # The heavy layer as two (CUDA wheels, then torch and Triton): the Engine fetches layers in
    # parallel but unpacks them one by one (the target's `split_heavy_layer`).
    split_heavy: bool = False
    # Why the image runs as root only (the target's `smoke: root_only:`); None: any UID with
    # group 0 on a read-only root, which the smoke test's any-user stage checks.
    root_only: str | None = None
    # GPU code coverage read from the locked wheels (plan/coverage.py): per arch, package →
    # sass | ptx | jit | none; and the (package, member, sha256) of every file it was read
    # from, which the smoke test checks the image installed unchanged.
    kernel_coverage: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = ()
    kernel_files: tuple[tuple[str, str, str], ...] = ()
    content_key: str = ""
    content_tag: str = ""
    tags: tuple[str, ...] = ()
    labels: tuple[tuple[str, str], ...] = field(default=())

    def ref(self, tag: str | None = None) -> str:
        return f"{self.repository}:{tag or self.content_tag}"

    @property
    def refs(self) -> tuple[str, ...]:
        """Every tag the image gets: the content tag first, then the moving ones."""
        return (self.ref(),) + tuple(self.ref(t) for t in self.tags)

    @property
    def cache_tag(self) -> str:
        """The tag on the newest image of this target (and platform) whose inline cache carries
        the heavy steps' results (image/inlinecache.py): what a fresh builder reads besides the
        moving tags, which may point at a bump that has none."""
        return self.content_tag.rsplit("-", 1)[0] + "-buildcache"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["overrides"] = [asdict(o) for o in self.overrides]
        d["labels"] = dict(self.labels)
        d["refs"] = list(self.refs)
        d["kernel_coverage"] = {a: dict(rows) for a, rows in self.kernel_coverage}
        d["kernel_files"] = [dict(zip(("package", "member", "sha256"), f))
                             for f in self.kernel_files]
        return d
