"""Attestations stored beside an image, as OCI artifacts that refer to its manifest digest
(the OCI 1.1 tag schema `sha256-<hex>.<kind>`, which every registry keeps; the Distribution
registry here has no referrers API):

- an SBOM (CycloneDX 1.5 JSON): every package of the lock with its version and sha256, and the
  base's OS packages as dpkg records them in the image;
- a provenance statement (in-toto, SLSA provenance v1 predicate): the spec, lock, patches, base
  and smoke model by digest, imgbuild's version and the workspace's git commit.

`verify` checks an image in a registry against them: its digest, its smoke report, its SBOM
against the lock the image's labels name (and the workspace's lock, when given).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from ..catalog.registries import SignPolicy
from ..errors import JobFailed
from ..lock.lockfile import LockedPackage, Lockfile, pins_digest
from ..plan.plan import Plan
from . import daemon, registry

SBOM_TYPE = "application/vnd.cyclonedx+json"
PROVENANCE_TYPE = "application/vnd.in-toto+json"
KINDS = {"sbom": SBOM_TYPE, "provenance": PROVENANCE_TYPE}


def tag(image_digest: str, kind: str) -> str:
    return image_digest.replace(":", "-") + f".{kind}"


def imgbuild_version() -> str:
    try:
        return version("imgbuild")
    except PackageNotFoundError:
        return "unknown"


def os_packages(image: str) -> list[dict[str, str]]:
    """The dpkg packages installed in a local image (name, version, architecture)."""
    r = subprocess.run(daemon.cli_command(["run", "--rm", "--network", "none", "--entrypoint",
                                           "cat", image, "/var/lib/dpkg/status"]),
                       capture_output=True, text=True, timeout=300)
    return dpkg_packages(r.stdout) if r.returncode == 0 else []


def dpkg_packages(status: str) -> list[dict[str, str]]:
    """The installed packages a dpkg status file lists, by name: what the SBOM says the base
    holds (a package dpkg knows but has not installed, or has removed, is not in it)."""
    out = []
    for block in status.split("\n\n"):
        rec = dict(line.split(": ", 1) for line in block.splitlines()
                   if ": " in line and not line.startswith(" "))
        if rec.get("Status", "").endswith(" installed") and "Package" in rec:
            out.append({"name": rec["Package"], "version": rec.get("Version", ""),
                        "arch": rec.get("Architecture", "")})
    return sorted(out, key=lambda p: p["name"])


def sbom(plan: Plan, lock: Lockfile, image_digest: str, debs: list[dict[str, str]]) -> dict:
    comps = [{"type": "library", "name": p.name, "version": p.version,
              "purl": f"pkg:pypi/{p.name}@{p.version}",
              "hashes": [{"alg": "SHA-256", "content": h.split(":", 1)[1]} for h in p.hashes]}
             for p in lock.packages]
    comps += [{"type": "library", "name": d["name"], "version": d["version"],
               "purl": f"pkg:deb/{plan.base_os.split()[0].lower()}/{d['name']}@{d['version']}"
                       f"?arch={d['arch']}"} for d in debs]
    return {
        "bomFormat": "CycloneDX", "specVersion": "1.5", "version": 1,
        # The same image has the same SBOM: its serial number comes from its digest.
        "serialNumber": "urn:uuid:" + _uuid_of(image_digest),
        "metadata": {
            "tools": {"components": [{"type": "application", "name": "imgbuild",
                                      "version": imgbuild_version()}]},
            "component": {"type": "container", "name": plan.repository,
                          "version": plan.content_tag, "bom-ref": image_digest,
                          "properties": [{"name": "io.imgbuild.lock.hash",
                                          "value": lock.digest}]}},
        "components": comps,
    }


def provenance(plan: Plan, image_digest: str, commit: str | None) -> dict:
    deps = [{"uri": plan.base_image, "digest": _digest(plan.base_digest)},
            {"uri": f"lockfiles/{Path(plan.lock_path).name}", "digest": _digest(plan.lock_hash)},
            {"uri": f"images/{plan.target}.yaml", "digest": _digest(plan.spec_digest)}]
    if plan.patch_digest:
        deps.append({"uri": "patches:" + ",".join(plan.applied_patches),
                     "digest": _digest(plan.patch_digest)})
    if plan.smoke_model_key:
        deps.append({"uri": f"smoke-model:{plan.smoke_model}",
                     "digest": {"sha256": plan.smoke_model_key}})
    return {
        "_type": "https://in-toto.io/Statement/v1",
        "subject": [{"name": plan.ref(), "digest": _digest(image_digest)}],
        "predicateType": "https://slsa.dev/provenance/v1",
        "predicate": {
            "buildDefinition": {
                "buildType": "https://github.com/imgbuild/imgbuild/build/v1",
                "externalParameters": {"target": plan.target, "model": plan.model,
                                       "archs": list(plan.archs), "flavor": plan.flavor,
                                       "content_key": plan.content_key},
                "resolvedDependencies": deps},
            "runDetails": {"builder": {"id": f"imgbuild {imgbuild_version()}"},
                           "metadata": {"source": {"git_commit": commit}}}},
    }


def _digest(d: str | None) -> dict[str, str]:
    return {d.split(":", 1)[0]: d.split(":", 1)[1]} if d and ":" in d else {}


def _uuid_of(digest: str) -> str:
    h = hashlib.sha256(digest.encode()).hexdigest()
    return f"{h[:8]}-{h[8:12]}-5{h[13:16]}-8{h[17:20]}-{h[20:32]}"


def git_commit(path: Path) -> str | None:
    r = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True,
                       text=True)
    return r.stdout.strip() if r.returncode == 0 else None


def push(repo: registry.Repository, image_digest: str, docs: dict[str, dict]) -> list[str]:
    """Store each document ({kind: doc}) as an artifact referring to image_digest; its tags."""
    out = []
    for kind, doc in docs.items():
        t = tag(image_digest, kind)
        registry.push_artifact(repo, t, KINDS[kind], doc, b"{}",
                               "application/vnd.oci.empty.v1+json", subject=image_digest)
        out.append(t)
    return out


def stored(repo: registry.Repository, image_digest: str) -> bool:
    """Whether the registry holds an SBOM and a provenance statement for image_digest."""
    return all(registry.manifest_digest(repo, tag(image_digest, kind)) is not None
               for kind in KINDS)


# --- verify -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Verification:
    ref: str
    digest: str
    checks: tuple[tuple[str, bool, str], ...]  # (what, ok, detail)
    labels: dict = field(default_factory=dict, hash=False)

    @property
    def ok(self) -> bool:
        return all(ok for _, ok, _ in self.checks)

    def to_dict(self) -> dict:
        return {"ref": self.ref, "digest": self.digest, "ok": self.ok,
                "checks": [{"check": c, "ok": ok, "detail": d} for c, ok, d in self.checks]}


def check_sbom(doc: dict | None, want: str | None) -> tuple[str, bool, str]:
    """The SBOM check of `verify` on plain data: the pins digest recomputed from the SBOM's own
    PyPI components must be `want`, the lock hash the image's label names. The SBOM's
    `io.imgbuild.lock.hash` property is never trusted: whoever tampers with the components can
    leave it as it was."""
    if doc is None:
        return ("sbom", False, "none stored")
    comps = doc.get("components", [])
    pkgs = tuple(LockedPackage(c["name"], c["version"],
                               tuple("sha256:" + h["content"] for h in c.get("hashes", [])))
                 for c in comps if c.get("purl", "").startswith("pkg:pypi/"))
    got = pins_digest(pkgs)
    debs = sum(1 for c in comps if "pkg:deb/" in c.get("purl", ""))
    return ("sbom", got == want,
            f"{len(pkgs)} locked packages, {debs} OS packages; their pins "
            + ("match the image's lock label" if got == want else
               f"({got[:19]}…) differ from the image's lock label ({want})"))


def judge(digest: str, labels: dict, report: dict | None, sbom_doc: dict | None,
          provenance_doc: dict | None, lock: Lockfile | None = None
          ) -> list[tuple[str, bool, str]]:
    """Everything `verify` decides after reading, on plain data: the smoke report, the SBOM
    (recomputed, see check_sbom), the workspace's lock and the provenance's subject, each
    against the image's digest and its lock label."""
    checks: list[tuple[str, bool, str]] = [("smoke report", bool(report and (report.get("ok") or report.get("forced"))),
        "none stored" if report is None else
        ("passed" if report.get("ok") else "FAILED" +
         (" (tags moved with --force)" if report.get("forced") else "")))]
    want = labels.get("io.imgbuild.lock.hash")
    checks.append(check_sbom(sbom_doc, want))
    if lock is not None:
        checks.append(("lock", lock.digest == want,
                       f"{lock.path.name} {'is' if lock.digest == want else 'is not'} the lock "
                       "the image was built from"))
    if provenance_doc is None:
        checks.append(("provenance", False, "none stored"))
    else:
        subj = provenance_doc.get("subject") or [{}]
        ok = subj[0].get("digest") == _digest(digest)
        checks.append(("provenance", ok, "names this digest" if ok else
                       f"names another image: {subj[0].get('digest')}"))
    return checks


def verify(repo: registry.Repository, ref_tag: str, *, lock: Lockfile | None = None,
           policy: SignPolicy | None = None) -> Verification:
    """Check the image `repo:ref_tag` in its registry against what is stored beside it; with a
    signature policy (images/registries.yaml's `signed-by`), its signature and signed
    attestations too (image/cosign.py)."""
    ref = f"{repo.name}{'@' if ref_tag.startswith('sha256:') else ':'}{ref_tag}"
    digest = registry.manifest_digest(repo, ref_tag)
    if digest is None:
        raise JobFailed(f"{ref} is not in the registry")
    if registry.manifest_descriptor(repo, digest) is None:
        raise JobFailed(f"{ref} names {digest}, which the registry does not hold")
    manifest, raw = registry.image_parts(repo, digest)
    problems = registry.image_problems(repo, digest)
    try:
        config = json.loads(raw)
    except ValueError:
        config = {}
    labels = ((config.get("config") if isinstance(config, dict) else None) or {}).get("Labels") \
        or {}
    checks: list[tuple[str, bool, str]] = [
        ("digest", True, f"manifest {digest} matches its bytes; config {manifest['config']['digest'][:19]}…"),
        ("image", not problems, "; ".join(problems) if problems else
         f"an image config whose {len(manifest.get('layers') or [])} diff ids are the "
         "manifest's layers, each held at its size")]
    report = registry.fetch_report(repo, digest)
    sbom_doc = registry.fetch_artifact(repo, tag(digest, "sbom"), SBOM_TYPE)
    prov_doc = registry.fetch_artifact(repo, tag(digest, "provenance"), PROVENANCE_TYPE)
    checks += judge(digest, labels, report, sbom_doc[1] if sbom_doc else None,
                    prov_doc[1] if prov_doc else None, lock)
    if policy is not None:
        # imported on use: the crypto is for a registry with a policy, never for a no-op build
        from . import signstore

        checks += signstore.checks(repo, digest, policy)[0]
    return Verification(ref, digest, tuple(checks), labels)


def dumps(doc: dict) -> bytes:
    return json.dumps(doc, indent=2, sort_keys=True).encode()
