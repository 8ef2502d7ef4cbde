"""The smoke checkpoint a plan names, by its recipe key: from the local cache, else from the
registry (an OCI artifact), else made by the pinned generator image. Whatever the machine has
installed plays no part: a plain install with no torch builds every target.

The artifact is `REPO:smoke-model-<name>-<key16>`: a JSON config (spec, recipe key, files and
their sha256) and one layer, the checkpoint directory as a reproducible tar (names sorted,
owner 0, mtime 0). Every blob is checked against its digest when fetched, and the unpacked
files against the manifest the checkpoint's own reference records.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

from .. import smokemodel
from ..errors import JobFailed
from ..image import daemon, registry
from ..payload import smoke as payload
from ..plan.decide import make_plan, smoke_model_key
from ..plan.render import ASSETS
from ..progress import SILENT, Progress
from ..workspace import Workspace
from .obtain import obtain

ARTIFACT_TYPE = "application/vnd.imgbuild.smoke-model.v1+json"
LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar"
GENERATE_TIMEOUT = 1800


def artifact_tag(name: str, key: str) -> str:
    return f"smoke-model-{name}-{key[:16]}"


def smoke_model(ws: Workspace, alias: str, key: str, client, repo: registry.Repository, *,
                log_dir: Path | None = None, progress: Progress = SILENT) -> Path:
    """The checkpoint directory of generated model `alias` with recipe key `key` (a Plan's
    smoke_model and smoke_model_key), complete and verified. With `log_dir`, the generator
    image's build log and the generator's output are kept there, as the target's build log is."""
    spec = smokemodel.spec_for(ws.catalog.model(alias))
    path = smokemodel.cache_path(spec, key=key)
    what = f"smoke model {alias} ({key[:12]})"
    if smokemodel.is_complete(path, spec, key):
        return path
    t0 = time.monotonic()
    if repo.host:
        found = registry.fetch_artifact(repo, artifact_tag(spec.name, key), ARTIFACT_TYPE)
        if found is not None:
            _unpack(found[2], path, spec, key, where=f"{repo.name}:{artifact_tag(spec.name, key)}")
            progress.note(f"{what}: fetched from {repo.name} in {time.monotonic() - t0:.1f} s")
            return path
    _generate(ws, alias, key, client, repo, path, log_dir=log_dir, progress=progress)
    if not smokemodel.is_complete(path, spec, key):
        raise JobFailed(f"the generator made {what}, but it does not verify",
                        hint="run it again; if it persists, the generator image is broken: "
                             f"`imgbuild build {ws.catalog.model(alias).generator_image}"
                             " --rebuild`")
    progress.note(f"{what}: made by the generator in {time.monotonic() - t0:.1f} s")
    return path


def publish_smoke_model(ws: Workspace, alias: str, key: str, client,
                        repo: registry.Repository, *, log_dir: Path | None = None,
                        progress: Progress = SILENT) -> str | None:
    """Push the checkpoint as an artifact unless the registry has it; its tag, or None when
    the repository names no registry."""
    if not repo.host:
        return None
    spec = smokemodel.spec_for(ws.catalog.model(alias))
    tag = artifact_tag(spec.name, key)
    if registry.manifest_digest(repo, tag) is not None:
        return tag
    path = smoke_model(ws, alias, key, client, repo, log_dir=log_dir, progress=progress)
    manifest = payload.file_manifest(path)
    registry.push_artifact(repo, tag, ARTIFACT_TYPE,
                           {"name": spec.name, "key": key, "spec": spec.key(), "files": manifest},
                           layer_tar(path), LAYER_TYPE,
                           annotations={"io.imgbuild.smoke-model.key": key})
    progress.note(f"pushed {repo.name}:{tag}")
    return tag


def layer_tar(path: Path) -> bytes:
    """The checkpoint directory as a tar that depends on its files' names and bytes only."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for p in sorted(Path(path).rglob("*")):
            info = tarfile.TarInfo(str(p.relative_to(path)))
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            if p.is_dir():
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tf.addfile(info)
            else:
                data = p.read_bytes()
                info.size, info.mode = len(data), 0o644
                tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _unpack(layer: bytes, path: Path, spec, key: str, *, where: str) -> None:
    """Unpack into a scratch directory beside the cache entry, verify, rename into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        try:
            with tarfile.open(fileobj=io.BytesIO(layer)) as tf:
                tf.extractall(tmp / "m", filter="data")
        except tarfile.TarError as e:
            # Not a tar, or one with a link or path out of the scratch directory: what a
            # registry serves is read, never trusted to write outside it.
            raise JobFailed(f"{where} does not hold the smoke model its tag names",
                            facts=[f"its layer cannot be unpacked: {e}"],
                            hint="nothing was used; delete the tag, and a build makes it "
                                 "anew") from None
        if not smokemodel.is_complete(tmp / "m", spec, key):
            raise JobFailed(f"{where} does not hold the smoke model its tag names",
                            hint="nothing was used; delete the tag, and a build makes it anew")
        _publish(tmp / "m", path, spec, key)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _publish(src: Path, path: Path, spec, key: str) -> None:
    """Move a verified checkpoint from `src` (in a scratch directory its caller removes) to
    the cache entry `path`. Another imgbuild (another target with the same smoke model, or a
    push, which runs outside the build lock) may have put a complete entry there meanwhile:
    it is kept, since the recipe key names the same bytes, and may be being read. Only a
    broken entry is replaced."""
    if smokemodel.is_complete(path, spec, key):
        return
    if path.exists():
        shutil.rmtree(path)
    os.rename(src, path)  # a cache entry appears whole or not at all


def _generate(ws: Workspace, alias: str, key: str, client, repo: registry.Repository,
              path: Path, *, log_dir: Path | None, progress: Progress) -> None:
    """Run the generator image (built from its own lock, or reused) with no network."""
    profile = ws.catalog.model(alias)
    spec = smokemodel.spec_for(profile)
    gen = make_plan(ws, profile.generator_image, repository=repo.name)
    obtain(ws, gen, ws.target(gen.target).lock(), client, repo, log_dir=log_dir,
           progress=progress)
    path.parent.mkdir(parents=True, exist_ok=True)
    out = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        out.chmod(0o777)  # the generator may run as another user than this process
        run = ["--network", "none", "-v", f"{out}:/out", "--entrypoint", "python", gen.ref(),
               f"{ASSETS}/smokegen.py", "/out/model", "--name", spec.name, "--scheme",
               spec.scheme, "--seed", str(spec.seed), "--key", key]
        cmd = daemon.cli_command(["run", "--rm", *run])  # as a person would run it by hand
        with progress.status(f"making smoke model {spec.name} in {gen.ref()}"):
            try:
                r = daemon.run_container("imgbuild-smokegen", run, capture_output=True,
                                         text=True, timeout=GENERATE_TIMEOUT)
            except subprocess.TimeoutExpired:
                raise JobFailed(f"the smoke-model generator ran over {GENERATE_TIMEOUT} s",
                                hint=f"run it by hand to see why: {' '.join(cmd)}") from None
        if log_dir is not None:
            # Kept on success too: it says what the checkpoint's reference outputs came from.
            (log_dir / f"{artifact_tag(spec.name, key)}.generate.log").write_text(
                f"$ {' '.join(cmd)}\n{r.stdout}{r.stderr}")
        if r.returncode != 0:
            raise JobFailed(f"the smoke-model generator failed (exit {r.returncode})",
                            log_tail=(r.stdout + r.stderr).strip().splitlines()[-25:],
                            hint=f"it ran as: {' '.join(cmd)}")
        _publish(out / "model", path, spec, key)
    finally:
        shutil.rmtree(out, ignore_errors=True)


def smoke_model_for(ws: Workspace, alias: str, *, registry_name: str | None = None,
                    push: bool = False, log_dir: Path | None = None,
                    progress: Progress = SILENT) -> dict:
    """`imgbuild smoke-model ALIAS`: the checkpoint of a generated profile, by its recipe key
    (what any target carrying it would use), with where it is and what it is."""
    profile = ws.catalog.model(alias)
    smokemodel.spec_for(profile)  # a profile that is not generated is bad input, said so
    repo = registry.repository(registry_name, push)
    key = smoke_model_key(ws, alias)
    client = daemon.client()
    registry.check_reachable(repo)
    path = smoke_model(ws, alias, key, client, repo, log_dir=log_dir, progress=progress)
    tag = publish_smoke_model(ws, alias, key, client, repo, progress=progress) if push else None
    return {"model": alias, "path": str(path), "pushed": tag} | describe(path)


def describe(path: Path) -> dict:
    """What a cached checkpoint is: its key, files and size (for reports)."""
    ref = json.loads((path / payload.REFERENCE_DIR / payload.REFERENCE_JSON).read_text())
    return {"key": ref.get("key"), "files": len(ref.get("files") or {}),
            "bytes": smokemodel.checkpoint_size(path), "versions": ref.get("versions")}
