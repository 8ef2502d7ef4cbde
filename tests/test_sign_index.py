"""A multi-platform target's signed index against the real client and the local registry:
Sigstore's cosign 2.5 (scripts/cosign.sh) accepts the index `imgbuild index --sign-key` signed,
on the multi-arch tag itself; imgbuild's `verify` accepts an index `cosign sign --key` signed;
`pull` and `run` refuse an unsigned or wrongly signed index before any layer moves.

The platform images are the tiny ones of tests/test_sign_interop.py (a config and one small
layer, written through the registry API) under tiny-cpu-multi's platform content tags, each
with what its build job would have left beside it (a passing smoke report, an SBOM that matches
its lock label, a provenance naming it, and its cosign signature): no build, seconds in all.
The decisions themselves: tests/test_decisions_index_sign.py."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from imgbuild.catalog.registries import SignPolicy
from imgbuild.errors import JobFailed
from imgbuild.image import attest, cosign, indexsign, registry, signstore
from imgbuild.image.registry import Repository
from imgbuild.lock.lockfile import pins_digest
from imgbuild.pipeline.index import assemble
from imgbuild.plan.index import IndexPlan, make_index_plan

from .conftest import ROOT, checkout_workspace
from .test_sign_interop import (
    HTTP,
    KEYS,
    PASSWORD,
    PREDICATES,
    cosign_cli,
    imgbuild,
    layer_of,
    policy_project,
    push_image,
)

pytestmark = pytest.mark.docker

MULTI = "tiny-cpu-multi"
PUB = str(KEYS / "cosign.pub")
TLOG = "--insecure-ignore-tlog=true"


@pytest.fixture()
def repo(own_repo) -> Repository:
    return Repository.parse(own_repo)


@pytest.fixture()
def shim(tmp_path, monkeypatch) -> Path:
    """IMGBUILD_COSIGN is tests/cosign_shim.py (the real cosign 2.5 behind it); its argv log."""
    from .test_cosign_delegation import shim_env

    return shim_env(tmp_path, monkeypatch)


@pytest.fixture(scope="module")
def key() -> cosign.SigningKey:
    return cosign.load_private_key((KEYS / "cosign.key").read_bytes(), PASSWORD.encode(), "k")


@pytest.fixture(scope="module")
def other() -> cosign.SigningKey:
    return cosign.load_private_key((KEYS / "other.key").read_bytes(), PASSWORD.encode(), "o")


def index_plan(repo: Repository) -> IndexPlan:
    return make_index_plan(checkout_workspace(), MULTI, repository=repo.name, resolve=False)


def push_platforms(repo: Repository, signer: cosign.SigningKey | None) -> dict[str, str]:
    """Each platform's tiny image under its content tag, as its build job leaves it; signed
    and attested by `signer` (None: unsigned). platform -> digest."""
    lock_label = {"io.imgbuild.lock.hash": pins_digest(())}  # the SBOM below lists no pins
    out = {}
    for p in index_plan(repo).plans:
        arch = p.platform.split("/")[1]
        d = push_image(repo, p.content_tag, f"tiny {arch}".encode(), architecture=arch,
                       labels=lock_label)
        registry.push_report(repo, d, {"ok": True, "stages": []})
        attest.push(repo, d, {"sbom": {"bomFormat": "CycloneDX", "components": []},
                              "provenance": {"subject": [{"name": p.ref(),
                                                          "digest": {"sha256": d[7:]}}]}})
        if signer is not None:
            signstore.sign(repo, d, signer, PREDICATES)
        out[p.platform] = d
    return out


def test_cosign_verifies_the_index_imgbuild_signed(repo, key):
    images = push_platforms(repo, key)
    r = imgbuild("index", MULTI, "--registry", repo.name, "--sign-key", str(KEYS / "cosign.key"),
                 "--json")
    assert r.returncode == 0, r.stderr
    [done] = json.loads(r.stdout)["indexes"]
    digest = done["digest"]
    assert done["manifests"] == images
    assert done["signed"] == [cosign.sig_tag(digest), cosign.att_tag(digest)]
    # cosign on the multi-arch tag itself: it resolves the tag to the index and reads the
    # index's own signature and attestations.
    tag = f"{repo.name}:{MULTI}"
    r = cosign_cli("verify", "--key", PUB, TLOG, *HTTP, tag)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)[0]["critical"]["image"]["docker-manifest-digest"] == digest
    stmts = {}
    for kind in ("cyclonedx", "slsaprovenance1"):
        r = cosign_cli("verify-attestation", "--key", PUB, TLOG, *HTTP, "--type", kind, tag)
        assert r.returncode == 0, r.stderr
        stmts[kind] = json.loads(base64.b64decode(json.loads(r.stdout.splitlines()[0])[
            "payload"]))
        assert stmts[kind]["subject"][0]["digest"] == {"sha256": digest[7:]}
    # What they say: the index's components are its platform images; it was made from them.
    assert [c["bom-ref"] for c in stmts["cyclonedx"]["predicate"]["components"]] == \
        list(images.values())
    assert [d["digest"]["sha256"] for d in stmts["slsaprovenance1"]["predicate"][
        "buildDefinition"]["resolvedDependencies"]] == [d[7:] for d in images.values()]
    # Another key is refused by cosign on the same tag.
    assert cosign_cli("verify", "--key", str(KEYS / "other.pub"), TLOG, *HTTP,
                      tag).returncode != 0
    # imgbuild's own verify of the tag: the index itself, then each platform's image.
    r = imgbuild("verify", tag, "--key", PUB, "--json")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    v = json.loads(r.stdout)
    assert v["index_digest"] == digest and v["ok"] is True
    assert [(c["check"], c["ok"]) for c in v["checks"]] == [
        ("signature", True), ("attestation cyclonedx", True),
        ("attestation slsaprovenance1", True)]
    assert sorted(v["platforms"]) == ["linux/amd64", "linux/arm64"]


def test_imgbuild_verifies_an_index_cosign_signed(repo, tmp_path):
    push_platforms(repo, None)
    plan = index_plan(repo)
    done = assemble(plan, repo)  # no key: an unsigned index, as before
    ref = f"{repo.name}@{done.digest}"
    k = str(KEYS / "cosign.key")
    # cosign signs the index and, --recursive, each platform image in it. `cosign attest` has
    # no recursion (its --recursive flag did nothing, sigstore/cosign#4141): each digest is
    # attested on its own.
    r = cosign_cli("sign", "--key", k, "--tlog-upload=false", "--yes", "--recursive", *HTTP, ref)
    assert r.returncode == 0, r.stderr
    for kind, predicate in zip(("cyclonedx", "slsaprovenance1"), PREDICATES.values()):
        (tmp_path / f"{kind}.json").write_text(json.dumps(predicate))
        for d in (done.digest, *(m for _, m in done.manifests)):
            r = cosign_cli("attest", "--key", k, "--tlog-upload=false", "--yes", *HTTP,
                           "--type", kind, "--predicate", str(tmp_path / f"{kind}.json"),
                           f"{repo.name}@{d}")
            assert r.returncode == 0, r.stderr
    r = imgbuild("verify", f"{repo.name}:{MULTI}", "--key", PUB, "--json")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    v = json.loads(r.stdout)
    assert v["index_digest"] == done.digest
    assert all(c["ok"] for c in v["checks"]) and len(v["checks"]) == 3
    for platform, doc in v["platforms"].items():
        signed = {c["check"]: c["ok"] for c in doc["checks"]
                  if c["check"].startswith(("signature", "attestation"))}
        assert signed == {"signature": True, "attestation cyclonedx": True,
                          "attestation slsaprovenance1": True}, platform
    # Under another key, the index's own signature is what fails first.
    got, _ = signstore.checks(repo, done.digest, SignPolicy("t", key=str(KEYS / "other.pub")))
    assert [ok for _, ok, _ in got] == [False, False, False]
    assert "a signature by another key" in got[0][2]


# --- refused before any layer moves ---------------------------------------------------------

def unsigned_index(repo, key, other, plan):
    d = assemble(plan, repo).digest
    return d, "none: the registry holds no"


def index_signed_by_another_key(repo, key, other, plan):
    d = assemble(plan, repo).digest
    signstore.sign(repo, d, other, PREDICATES)
    return d, "a signature by another key"


def index_swapped_after_signing(repo, key, other, plan):
    """The index signed, then another one put under its tags (what someone with push rights
    but not the key can do), the first one's signature and attestations copied along."""
    signed = assemble(plan, repo, signer=key).digest
    got = repo.api.request("GET", f"{repo.path}/manifests/{signed}", scope=repo.scope("pull"),
                           headers={"Accept": registry.OCI_INDEX})
    doc = json.loads(got.content)
    doc["annotations"]["org.example.swapped"] = "yes"
    body = json.dumps(doc, indent=2).encode()
    for tag in (plan.content_tag, *plan.tags):
        d = registry.put_index(repo, tag, body)
    for tag in (cosign.sig_tag, cosign.att_tag):
        m = repo.api.request("GET", f"{repo.path}/manifests/{tag(signed)}",
                             scope=repo.scope("pull"), headers={"Accept": registry.OCI_MANIFEST})
        r = repo.api.request("PUT", f"{repo.path}/manifests/{tag(d)}",
                             scope=repo.scope("pull", "push"), data=m.content,
                             headers={"Content-Type": registry.OCI_MANIFEST})
        assert r.status_code == 201, r.text
    return d, f"a signature by this key of another image, {signed}"


@pytest.mark.parametrize("make", [unsigned_index, index_signed_by_another_key,
                                  index_swapped_after_signing])
def test_pull_refuses_an_index_the_policy_does_not_accept(repo, key, other, tmp_path, make):
    """In this process (`run`, through the CLI, is the test below). Every platform image is
    signed as the policy asks: only the index is wrong."""
    from imgbuild.pipeline.pull import pull_target
    from imgbuild.workspace import Workspace

    images = push_platforms(repo, key)
    plan = index_plan(repo)
    digest, said = make(repo, key, other, plan)
    # The platform images' layers are taken out of the registry: a pull that went ahead would
    # fail on them (exit 3, "pull ... failed"), not on the policy.
    for d in images.values():
        r = repo.api.request("DELETE", f"{repo.path}/blobs/{layer_of(repo, d)}",
                             scope=repo.scope("pull", "push"))
        assert r.status_code == 202, r.text
    ws = Workspace.open(policy_project(tmp_path, repo), ROOT / "lockfiles", env={},
                        cwd=tmp_path)
    policy = ws.registries.policy_for(repo.name)
    with pytest.raises(JobFailed) as e:
        pull_target(ws, MULTI, model=None, registry_name=repo.name)
    err = e.value
    assert err.exit_code == 1
    assert err.message == (f"the index of {MULTI}, {repo.name}@{digest} is not signed as "
                           f"{policy.where} asks; nothing was pulled")
    assert err.facts[0] == f"{plan.ref()} names {digest}"
    assert err.facts[1].startswith(f"policy: signed by the key {KEYS / 'cosign.pub'}")
    assert said in " ".join(err.facts[2:])
    assert f"`imgbuild index {MULTI} --registry {repo.name} --sign-key KEY`" in err.hint
    assert f"cosign verify --key {KEYS / 'cosign.pub'} {TLOG}" in err.hint
    # `verify` says the same of the index, and nothing of its images is wrong.
    from imgbuild.cli.commands.verify import index_checks

    own = index_checks(repo, digest, policy)
    assert not own[0][1] and said in own[0][2]
    for d in images.values():
        assert all(ok for _, ok, _ in signstore.checks(repo, d, policy)[0])


def test_run_refuses_an_unsigned_index_until_imgbuild_index_signs_it(repo, key, tmp_path):
    push_platforms(repo, key)
    plan = index_plan(repo)
    digest = assemble(plan, repo).digest  # assembled without the key
    policy_images = policy_project(tmp_path, repo)
    r = imgbuild("run", MULTI, "--registry", repo.name, "--no-preflight", images=policy_images)
    said = " ".join(r.stderr.split())
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"the index of {MULTI}, {repo.name}@{digest} is not signed as" in said
    assert f"none: the registry holds no {cosign.sig_tag(digest)}" in said
    assert "pull of" not in said and "Traceback" not in said  # the Engine was never asked
    # `verify` of the tag fails on the index alone: every platform image verifies.
    r = imgbuild("verify", f"{repo.name}:{MULTI}", "--json", images=policy_images)
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    v = json.loads(r.stdout)
    assert v["ok"] is False and v["checks"][0]["check"] == "signature"
    assert not v["checks"][0]["ok"] and cosign.sig_tag(digest) in v["checks"][0]["detail"]
    assert all(doc["ok"] for doc in v["platforms"].values())
    # `imgbuild index --sign-key` signs that very index (the same platforms, the same digest:
    # its tags stay on it) and the policy accepts it now.
    r = imgbuild("index", MULTI, "--registry", repo.name, "--sign-key", str(KEYS / "cosign.key"),
                 "--json", images=policy_images)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["indexes"][0]["digest"] == digest
    from imgbuild.catalog.registries import load_registries

    policy = load_registries([policy_images]).policy_for(repo.name)
    assert all(ok for _, ok, _ in signstore.enforce(repo, digest, policy, plan.ref()))
    r = imgbuild("verify", f"{repo.name}:{MULTI}", images=policy_images)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    said = " ".join(r.stdout.split())
    assert "the index itself: ok" in said
    assert f"cosign checks the same: cosign verify --key {KEYS / 'cosign.pub'} {TLOG} " \
           f"{' '.join(HTTP)} {repo.name}@{digest}" in said


def signed_by_another_only(repo: Repository, digest: str, other: cosign.SigningKey) -> None:
    """The image re-signed by someone else only: its own signature by the key removed."""
    repo.api.request("DELETE", f"{repo.path}/manifests/"
                     f"{registry.manifest_digest(repo, cosign.sig_tag(digest))}",
                     scope=repo.scope("pull", "push"))
    signstore.sign(repo, digest, other, {})


def test_index_refuses_to_sign_over_a_platform_image_another_key_signed(repo, key, other):
    images = push_platforms(repo, key)
    arm = images["linux/arm64"]
    signed_by_another_only(repo, arm, other)
    plan = index_plan(repo)
    r = imgbuild("index", MULTI, "--registry", repo.name, "--sign-key", str(KEYS / "cosign.key"))
    said = " ".join(r.stderr.split())
    assert r.returncode == 1, said
    assert f"the index of {MULTI} was not assembled; no tag moved" in said
    assert f"linux/arm64: {arm}: signature: no signature by" in said
    assert "(the signing key)" in said and "a signature by another key" in said
    assert "linux/amd64:" not in said
    for tag in (plan.content_tag, *plan.tags):
        assert registry.manifest_digest(repo, tag) is None


# --- keyless and KMS: cosign signs the index (through tests/cosign_shim.py) -------------------

FORK = "https://github.com/evil/serving/.github/workflows/images.yml@refs/heads/main"


def test_an_index_signed_keyless_vouches_only_for_platforms_of_its_identity(
        repo, shim, tmp_path, monkeypatch):
    """As the workflow's index job signs: keyless, no `signed-by` policy. The platform images
    were signed keyless by the build jobs; cosign's certificate for the index (the stand-in
    CA's, for the workflow's identity) must name the identity theirs name."""
    from imgbuild.image.cosigncli import Delegated

    from .sigstore_standin import GHA_ISSUER, GHA_SUBJECT, StandIn
    from .test_cosign_delegation import SHIM, keyless_as

    standin = StandIn.make()
    keyless = Delegated(str(SHIM), None)
    images = push_platforms(repo, None)
    amd, arm = images["linux/amd64"], images["linux/arm64"]
    plan = index_plan(repo)
    keyless_as(tmp_path, monkeypatch, standin)
    signstore.sign_as(repo, amd, keyless, PREDICATES)
    keyless_as(tmp_path, monkeypatch, standin, FORK)  # arm64 signed by another workflow
    signstore.sign_as(repo, arm, keyless, PREDICATES)
    keyless_as(tmp_path, monkeypatch, standin)
    signs = len(shim.read_text().splitlines())
    with pytest.raises(JobFailed) as e:
        assemble(plan, repo, signer=keyless)
    said = e.value.facts
    assert f"linux/arm64: {arm}: signature: keyless as {FORK} (issuer {GHA_ISSUER}); the " \
           "platform images name 2 identities, and one signs the index" in said
    assert said[-1] == indexsign.SAME_IDENTITY
    assert len(shim.read_text().splitlines()) == signs  # cosign was not asked to sign
    assert all(registry.manifest_digest(repo, t) is None for t in (plan.content_tag, *plan.tags))
    # arm64 signed again by this workflow: its last signature names the same identity.
    signstore.sign_as(repo, arm, keyless, PREDICATES)
    # An index job of another workflow signs, and its index gets no tag.
    keyless_as(tmp_path, monkeypatch, standin, FORK)
    with pytest.raises(JobFailed, match="not signed by the identity that signed its platform"):
        assemble(plan, repo, signer=keyless)
    assert all(registry.manifest_digest(repo, t) is None for t in (plan.content_tag, *plan.tags))
    keyless_as(tmp_path, monkeypatch, standin)
    done = assemble(plan, repo, signer=keyless)
    assert done.signed_by == {"method": "keyless", "subject": GHA_SUBJECT, "issuer": GHA_ISSUER}
    assert registry.manifest_digest(repo, MULTI) == done.digest
    # A keyless policy for the workflow's identity accepts the index; one for the fork's does
    # not look at the fork's signature alone: the workflow's is there too.
    policy = SignPolicy(str(tmp_path / "registries.yaml"), issuer=GHA_ISSUER,
                        subject=GHA_SUBJECT, trust_root="trusted_root.json", tlog=False)
    found, _ = signstore.checks(repo, done.digest, policy)
    assert [ok for _, ok, _ in found] == [True, True, True], found
    # cosign on the multi-arch tag: the index's own keyless signature and attestations (the
    # stand-in's chain and CT key given offline, as tests/test_sign_interop.py does).
    offline = ["--certificate-chain", str(tmp_path / "chain.pem"), TLOG, *HTTP]
    tag = f"{repo.name}:{MULTI}"
    r = cosign_cli("verify", "--certificate-identity", GHA_SUBJECT, "--certificate-oidc-issuer",
                   GHA_ISSUER, *offline, tag)
    assert r.returncode == 0, r.stderr
    r = cosign_cli("verify-attestation", "--type", "slsaprovenance1", "--certificate-identity",
                   GHA_SUBJECT, "--certificate-oidc-issuer", GHA_ISSUER, *offline, tag)
    assert r.returncode == 0, r.stderr


def test_an_index_signed_with_a_kms_key_through_cosign(repo, key, other, shim):
    """`imgbuild index --sign-key hashivault://…` (the shim signs with tests/fixtures/cosign's
    key in the KMS's place): the KMS key's public half, read through `cosign public-key`, is
    what each platform image must be signed by."""
    from .test_cosign_delegation import KMS, argvs

    images = push_platforms(repo, key)
    arm = images["linux/arm64"]
    signed_by_another_only(repo, arm, other)
    r = imgbuild("index", MULTI, "--registry", repo.name, "--sign-key", KMS)
    said = " ".join(r.stderr.split())
    assert r.returncode == 1, said
    assert f"linux/arm64: {arm}: signature: no signature by" in said
    assert f"a signature by {cosign.key_id(key.key.public_key())} ({KMS}), the key that signs " \
           "the index" in said
    assert [a[0] for a in argvs(shim)] == ["version", "public-key"]  # nothing signed
    signstore.sign(repo, arm, key, PREDICATES)
    r = imgbuild("index", MULTI, "--registry", repo.name, "--sign-key", KMS, "--json")
    assert r.returncode == 0, r.stderr
    [done] = json.loads(r.stdout)["indexes"]
    assert done["signed_by"] == {"method": "kms", "key": KMS}
    got = argvs(shim)[2:]
    assert [a[0] for a in got] == ["version", "public-key", "sign", "attest", "attest"]
    assert all(a[-1] == f"{repo.name}@{done['digest']}" for a in got[2:])
    r = cosign_cli("verify", "--key", PUB, TLOG, *HTTP, f"{repo.name}:{MULTI}")
    assert r.returncode == 0, r.stderr
