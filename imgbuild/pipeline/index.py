"""`imgbuild index TARGET --registry R`: assemble a multi-platform target's OCI image index.

Each platform's image is built, smoke-tested and pushed on its own (on its own runner in CI:
`imgbuild build T --platform linux/arm64 --push`), which stores its smoke report, SBOM and
provenance by that image's digest. The index is assembled after all of them passed: it lists
the registry's manifests for the platforms' content tags, goes under the index's content tag,
and only then under the moving tags. An index never lists an image without a passing report.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import JobFailed
from ..image import registry
from ..plan.index import IndexPlan
from ..progress import SILENT, Progress


@dataclass(frozen=True)
class Assembled:
    plan: IndexPlan
    digest: str
    manifests: tuple[tuple[str, str], ...]  # (platform, manifest digest)
    pushed: tuple[str, ...]  # ref@digest: the content tag, then the moving tags

    def to_dict(self) -> dict:
        return {"target": self.plan.target, "content_tag": self.plan.content_tag,
                "refs": list(self.plan.refs), "digest": self.digest,
                "manifests": dict(self.manifests), "pushed": list(self.pushed)}


@dataclass(frozen=True)
class Stored:
    """What the registry holds for one platform's content tag: the manifest's descriptor (None
    when the tag is not there), its image's architecture and the smoke report stored for it."""

    platform: str  # linux/<arch>
    ref: str  # repository:content tag
    descriptor: dict | None
    architecture: str | None = None
    report: dict | None = None
    problems: tuple[str, ...] = ()  # what `verify` finds wrong with the image itself


def refusals(stored: tuple[Stored, ...]) -> list[str]:
    """Why the index may not be assembled, one line a platform's problem; [] when every
    platform's image is there, of its platform, with a passing (or forced) smoke report. The
    decision alone, on plain data: `assemble` only gathers what it reads."""
    problems: list[str] = []
    for s in stored:
        if s.descriptor is None:
            problems.append(f"{s.platform}: {s.ref} is not in the registry")
            continue
        problems.extend(f"{s.platform}: {p}" for p in s.problems)
        if s.architecture != s.platform.split("/", 1)[1]:
            problems.append(f"{s.platform}: {s.ref} is an image for {s.architecture}")
        digest = s.descriptor["digest"]
        if s.report is None:
            problems.append(f"{s.platform}: no smoke report stored for {digest}")
        elif not (s.report.get("ok") or s.report.get("forced")):
            problems.append(f"{s.platform}: its smoke report for {digest} says FAILED")
    return problems


def assemble(plan: IndexPlan, repo: registry.Repository, *,
             progress: Progress = SILENT) -> Assembled:
    """Check every platform's image in the registry (there, of its platform, with a passing or
    forced smoke report), then push the index and move the moving tags onto it."""
    stored: list[Stored] = []
    for p in plan.plans:
        d = registry.manifest_descriptor(repo, p.content_tag)
        if d is None:
            stored.append(Stored(p.platform, p.ref(), None))
            continue
        _, config = registry.image_config(repo, d["digest"])
        stored.append(Stored(p.platform, p.ref(), d, config.get("architecture"),
                             registry.fetch_report(repo, d["digest"]),
                             tuple(registry.image_problems(repo, d["digest"]))))
    problems = refusals(tuple(stored))
    if problems:
        raise JobFailed(
            f"the index of {plan.target} was not assembled; no tag moved", facts=problems,
            hint=f"build, smoke-test and push each platform (`imgbuild {plan.target} --platform "
                 f"PLATFORM --push --registry {repo.name}`), then run `imgbuild index "
                 f"{plan.target} --registry {repo.name}` again")
    entries = [(s.platform, s.descriptor) for s in stored if s.descriptor is not None]
    body = registry.index_document(entries, {
        "io.imgbuild.target": plan.target, "io.imgbuild.content-key": plan.content_key})
    tags = (plan.content_tag,) + plan.tags
    digest = registry.push_index(repo, tags, body)
    progress.note(f"pushed the index {plan.ref()}@{digest[:19]}… ({', '.join(plan.platforms)})"
                  f" and moved {', '.join(plan.tags)} onto it")
    return Assembled(plan, digest, tuple((p, d["digest"]) for p, d in entries),
                     tuple(f"{plan.ref(t)}@{digest}" for t in tags))
