"""A multi-platform target's index, signed in cosign's format, decided on plain data
(image/indexsign.py, pipeline/index.py's refusals and the order `assemble` writes in, with the
registry's calls faked by an in-memory one): no Docker, no registry. The real registry and the
real cosign client: tests/test_sign_index.py."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import pytest

from imgbuild.catalog.registries import ATTESTATION_TYPES, SIGNING_KEY, SignPolicy
from imgbuild.errors import EXIT_ENV, EXIT_FAILED, EnvError, JobFailed
from imgbuild.image import cosign, indexsign, registry, signstore
from imgbuild.image.registry import Repository
from imgbuild.pipeline import index as pindex
from imgbuild.plan.index import make_index_plan

from .conftest import checkout_workspace

KEYS = Path(__file__).parent / "fixtures" / "cosign"
PASSWORD = b"imgbuild-test"
REPO = "127.0.0.1:5000/acme/serving"
INDEX = "sha256:" + "1d" * 32
AMD = "sha256:" + "a1" * 32
ARM = "sha256:" + "a2" * 32
MANIFESTS = (("linux/amd64", AMD), ("linux/arm64", ARM))


@pytest.fixture(scope="module")
def key() -> cosign.SigningKey:
    return cosign.load_private_key((KEYS / "cosign.key").read_bytes(), PASSWORD, "cosign.key")


@pytest.fixture(scope="module")
def other() -> cosign.SigningKey:
    return cosign.load_private_key((KEYS / "other.key").read_bytes(), PASSWORD, "other.key")


def predicates(**kw) -> dict[str, dict]:
    args = dict(target="tiny-cpu-multi", model=None, content_tag="tiny-cpu-multi-0123",
                content_key="sha256:" + "cc" * 32, manifests=MANIFESTS, tool_version="0.1.0",
                commit="abc") | kw
    return indexsign.index_predicates(REPO, INDEX, **args)


# --- what the index is attested with ---------------------------------------------------------

def test_the_index_carries_both_attestation_types_about_itself():
    got = predicates()
    assert set(got) == set(ATTESTATION_TYPES.values())
    # The statements about the index name its digest as their subject (cosign.statement).
    for ptype, predicate in got.items():
        stmt = cosign.statement(REPO, INDEX, ptype, predicate)
        assert stmt["subject"] == [{"name": REPO, "digest": {"sha256": "1d" * 32}}]


def test_the_index_sbom_lists_its_platform_images_not_their_packages():
    bom = predicates()[ATTESTATION_TYPES["cyclonedx"]]
    assert bom["bomFormat"] == "CycloneDX" and bom["specVersion"] == "1.5"
    assert bom["metadata"]["component"]["bom-ref"] == INDEX
    assert bom["metadata"]["component"]["type"] == "container"
    comps = bom["components"]
    assert [c["bom-ref"] for c in comps] == [AMD, ARM]
    assert all(c["type"] == "container" for c in comps)
    assert [c["hashes"] for c in comps] == [[{"alg": "SHA-256", "content": "a1" * 32}],
                                            [{"alg": "SHA-256", "content": "a2" * 32}]]
    assert comps[1]["purl"] == (f"pkg:oci/serving@sha256%3A{'a2' * 32}?arch=arm64&os=linux"
                                f"&repository_url={REPO}")
    assert {"name": "io.imgbuild.platform", "value": "linux/arm64"} in comps[1]["properties"]
    assert bom["dependencies"] == [{"ref": INDEX, "dependsOn": [AMD, ARM]}]
    assert not any(c.get("purl", "").startswith(("pkg:pypi/", "pkg:deb/")) for c in comps)


def test_the_index_provenance_names_the_manifests_it_was_made_from():
    prov = predicates()[ATTESTATION_TYPES["slsaprovenance1"]]
    bd = prov["buildDefinition"]
    assert bd["buildType"] == indexsign.INDEX_BUILD_TYPE
    assert bd["externalParameters"]["platforms"] == ["linux/amd64", "linux/arm64"]
    assert bd["resolvedDependencies"] == [
        {"uri": f"{REPO}@{AMD}", "name": "linux/amd64", "digest": {"sha256": "a1" * 32}},
        {"uri": f"{REPO}@{ARM}", "name": "linux/arm64", "digest": {"sha256": "a2" * 32}}]
    # cosign attest --type slsaprovenance1 reads these two as required.
    assert prov["runDetails"]["builder"]["id"] == "imgbuild 0.1.0"


def test_the_same_index_gives_the_same_statements():
    assert json.dumps(predicates(), sort_keys=True) == json.dumps(predicates(), sort_keys=True)
    other = predicates(manifests=(("linux/amd64", AMD), ("linux/arm64", "sha256:" + "b" * 64)))
    assert other != predicates()


# --- what each platform image must pass first -----------------------------------------------

def test_platform_policy_is_the_registrys_else_the_signing_keys_else_nothing(key):
    policy = SignPolicy("r.yaml", key="k.pub")
    assert indexsign.platform_policy(policy, key.public_pem().decode()) is policy
    assert indexsign.platform_policy(policy, None) is policy
    by_key = indexsign.platform_policy(None, key.public_pem().decode())
    assert by_key == SignPolicy(SIGNING_KEY, key=key.public_pem().decode(), attestations=())
    assert indexsign.platform_policy(None, None) is None


def stored(platform: str, digest: str, checks=()) -> pindex.Stored:
    return pindex.Stored(platform, f"r/t:t-{platform.split('/')[1]}",
                         {"mediaType": registry.OCI_MANIFEST_TYPE, "digest": digest, "size": 1},
                         platform.split("/")[1], {"ok": True}, (), tuple(checks))


def test_an_index_over_an_image_the_key_did_not_sign_is_refused(key, other):
    mine = cosign.signature_layer(key, REPO, AMD)
    theirs = cosign.signature_layer(other, REPO, ARM)
    want = indexsign.platform_policy(None, key.public_pem().decode())
    amd = cosign.judge(want, AMD, [mine], None, key.key.public_key())
    arm = cosign.judge(want, ARM, [theirs], None, key.key.public_key())
    assert pindex.refusals((stored("linux/amd64", AMD, amd),)) == []
    problems = pindex.refusals((stored("linux/amd64", AMD, amd), stored("linux/arm64", ARM, arm)))
    assert len(problems) == 1
    assert problems[0].startswith(f"linux/arm64: {ARM}: signature: no signature by "
                                  f"{cosign.key_id(key.key.public_key())} (the signing key)")
    assert "a signature by another key" in problems[0]
    nothing = cosign.judge(want, ARM, None, None, key.key.public_key())
    [line] = pindex.refusals((stored("linux/arm64", ARM, nothing),))
    assert f"the registry holds no {cosign.sig_tag(ARM)}" in line


def test_under_a_policy_a_platform_image_lacking_an_attestation_is_refused(key):
    policy = SignPolicy("r.yaml", key="k.pub")
    sig = [cosign.signature_layer(key, REPO, ARM)]
    checks = cosign.judge(policy, ARM, sig, None, key.key.public_key())
    problems = pindex.refusals((stored("linux/arm64", ARM, checks),))
    assert [p.split(": ")[2] for p in problems] == ["attestation cyclonedx",
                                                    "attestation slsaprovenance1"]
    assert "(the policy's key)" in checks[0][2]


def test_what_was_asked_of_the_platforms_is_said():
    keyless = SignPolicy("r.yaml", issuer="https://i", subject="s", attestations=())
    assert indexsign.asked_of_platforms(keyless, "-") == \
        "asked of each platform image by r.yaml: a keyless signature of s (https://i)"
    assert indexsign.asked_of_platforms(SignPolicy("r.yaml", key="k", attestations=("cyclonedx",)),
                                        "sha256:12 (k)") == \
        "asked of each platform image by r.yaml: a signature by sha256:12 (k), attestations " \
        "cyclonedx"


def test_the_content_tag_never_moves_and_verify_needs_the_index_and_each_image():
    assert indexsign.content_tag_refusal(None, INDEX) is None
    assert indexsign.content_tag_refusal(INDEX, INDEX) is None
    assert indexsign.content_tag_refusal(AMD, INDEX) == \
        f"the content tag names {AMD}, the index assembled now is {INDEX}"
    good = [("signature", True, ""), ("attestation cyclonedx", True, "")]
    assert indexsign.verified(good, [True, True]) and indexsign.verified([], [True])
    assert not indexsign.verified(good, [])
    assert not indexsign.verified(good, [True, False])
    assert not indexsign.verified([("signature", False, "none")], [True, True])


# --- the order assemble writes in, against an in-memory registry ----------------------------

class FakeRegistry:
    """The registry calls `assemble` makes, in memory: platform images under their content
    tags, `.sig`/`.att` layers by tag; every write recorded in order."""

    def __init__(self, monkeypatch, plan, key: cosign.SigningKey | None, *,
                 sign_platforms: bool = True, fail_put: str | None = None):
        self.events: list[tuple[str, str]] = []
        self.tags: dict[str, str] = {}
        self.layers: dict[str, list[cosign.Layer]] = {}
        self.fail_put = fail_put
        self.images = {}
        for p in plan.plans:
            digest = "sha256:" + hashlib.sha256(p.platform.encode()).hexdigest()
            self.tags[p.content_tag] = digest
            self.images[digest] = p.platform.split("/")[1]
            if key is not None and sign_platforms:
                self.layers[cosign.sig_tag(digest)] = [
                    cosign.signature_layer(key, REPO, digest)]
                self.layers[cosign.att_tag(digest)] = [
                    cosign.attestation_layer(key, cosign.statement(REPO, digest, t, {"x": 1}))
                    for t in ATTESTATION_TYPES.values()]
        m = monkeypatch
        m.setattr(registry, "manifest_descriptor", lambda repo, ref: (
            {"mediaType": registry.OCI_MANIFEST_TYPE, "digest": self.tags[ref], "size": 1}
            if ref in self.tags else None))
        m.setattr(registry, "manifest_digest", lambda repo, ref: self.tags.get(ref))
        m.setattr(registry, "image_config",
                  lambda repo, d: ({}, {"architecture": self.images[d]}))
        m.setattr(registry, "fetch_report", lambda repo, d: {"ok": True})
        m.setattr(registry, "image_problems", lambda repo, d: [])
        m.setattr(registry, "put_index", self.put_index)
        m.setattr(registry, "push_index", self.push_index)
        m.setattr(signstore, "fetch_layers", lambda repo, tag: self.layers.get(tag))
        m.setattr(signstore, "_put", self.put_layers)

    def put_index(self, repo, reference, body):
        self.events.append(("index by digest", reference))
        return reference

    def push_index(self, repo, tags, body):
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        for t in tags:
            self.events.append(("tag", t))
            self.tags[t] = digest
        return digest

    def put_layers(self, repo, tag, layers):
        if self.fail_put and tag.endswith(self.fail_put):
            raise EnvError(f"registry 127.0.0.1:5000 refused manifest {tag} in acme/serving: "
                           "the account may pull but not push", hint="log in with an account "
                                                                     "that may push")
        self.events.append(("put", tag[-4:]))
        self.layers[tag] = layers
        return tag


@pytest.fixture(scope="module")
def plan():
    return make_index_plan(checkout_workspace(), "tiny-cpu-multi", repository=REPO,
                           resolve=False)


def test_the_index_is_put_by_digest_then_signed_then_tagged(monkeypatch, plan, key):
    fake = FakeRegistry(monkeypatch, plan, key)
    policy = SignPolicy(str(KEYS / "registries.yaml"), key="cosign.pub")
    done = pindex.assemble(plan, Repository.parse(REPO), signer=key, policy=policy)
    assert fake.events == [("index by digest", done.digest), ("put", ".att"), ("put", ".sig"),
                           ("tag", plan.content_tag), *[("tag", t) for t in plan.tags]]
    assert done.signed == (cosign.sig_tag(done.digest), cosign.att_tag(done.digest))
    # What was written passes the policy: the signature and both attestations of the index.
    checks, _ = signstore.checks(Repository.parse(REPO), done.digest, policy)
    assert [(c, ok) for c, ok, _ in checks] == [
        ("signature", True), ("attestation cyclonedx", True),
        ("attestation slsaprovenance1", True)]
    env = json.loads(fake.layers[cosign.att_tag(done.digest)][0].blob)
    stmt = json.loads(base64.b64decode(env["payload"]))
    assert stmt["subject"][0]["digest"] == {"sha256": done.digest.split(":")[1]}
    assert [c["bom-ref"] for c in stmt["predicate"]["components"]] == [d for _, d in
                                                                       done.manifests]
    # Again: the same index, nothing signed twice, the tags put again onto the same digest.
    fake.events.clear()
    again = pindex.assemble(plan, Repository.parse(REPO), signer=key, policy=policy)
    assert again.digest == done.digest and again.signed == ()
    assert [e for e in fake.events if e[0] == "put"] == []


@pytest.mark.parametrize("fails", [".att", ".sig"])
def test_a_signing_that_fails_moves_no_tag(monkeypatch, plan, key, fails):
    fake = FakeRegistry(monkeypatch, plan, key, fail_put=fails)
    with pytest.raises(EnvError) as e:  # the registry's refusal keeps its exit code
        pindex.assemble(plan, Repository.parse(REPO), signer=key)
    err = e.value
    assert err.exit_code == EXIT_ENV
    assert err.message.startswith(f"the index {REPO}@sha256:") and "no tag moved" in err.message
    assert "refused manifest" in err.facts[0]
    assert "by its digest only: no tag names it" in err.facts[-1]
    assert "log in with an account that may push; then run `imgbuild index" in err.hint
    assert [e for e in fake.events if e[0] == "tag"] == []
    assert plan.content_tag not in fake.tags and not set(plan.tags) & set(fake.tags)
    # Cut short at the signature: the attestations alone are there, no signature anywhere.
    digest = fake.events[0][1]
    assert cosign.sig_tag(digest) not in fake.layers
    assert (cosign.att_tag(digest) in fake.layers) is (fails == ".sig")


def test_platform_images_not_signed_by_the_key_refuse_the_index_before_anything(
        monkeypatch, plan, key, other):
    fake = FakeRegistry(monkeypatch, plan, other)  # the platforms signed by another key
    with pytest.raises(JobFailed) as e:
        pindex.assemble(plan, Repository.parse(REPO), signer=key)
    err = e.value
    assert err.exit_code == EXIT_FAILED
    assert err.message == "the index of tiny-cpu-multi was not assembled; no tag moved"
    assert [f.split(": ")[0] for f in err.facts[:2]] == ["linux/amd64", "linux/arm64"]
    assert all("a signature by another key" in f and "(the signing key)" in f
               for f in err.facts[:2])
    # What was asked, beside what was found.
    assert err.facts[2] == ("asked of each platform image: a signature by "
                            f"{cosign.key_id(key.key.public_key())} (cosign.key), the key "
                            "that signs the index")
    assert err.hint.startswith("sign each platform's image with the same key")
    assert fake.events == []  # nothing written: not even the index by digest


def test_unsigned_platforms_are_refused_only_when_signing_or_under_a_policy(monkeypatch, plan,
                                                                            key):
    fake = FakeRegistry(monkeypatch, plan, None)
    done = pindex.assemble(plan, Repository.parse(REPO))  # no key, no policy: as before
    assert done.signed == () and fake.events[-1] == ("tag", plan.tags[-1])
    fake = FakeRegistry(monkeypatch, plan, None)
    policy = SignPolicy(str(KEYS / "registries.yaml"), key="cosign.pub")
    with pytest.raises(JobFailed, match="was not assembled") as e:
        pindex.assemble(plan, Repository.parse(REPO), policy=policy)
    assert fake.events == []
    assert e.value.facts[-1] == (
        f"asked of each platform image by {policy.where}: a signature by "
        f"{cosign.key_id(key.key.public_key())} ({KEYS / 'cosign.pub'}), attestations "
        "cyclonedx, slsaprovenance1")


def test_under_a_policy_an_index_nobody_signed_gets_no_tag(monkeypatch, plan, key):
    """Signed platform images, the index pushed without a key: it stays by digest, untagged,
    until it is signed (by imgbuild with --sign-key, or by cosign with a KMS key)."""
    fake = FakeRegistry(monkeypatch, plan, key)
    policy = SignPolicy(str(KEYS / "registries.yaml"), key="cosign.pub")
    with pytest.raises(JobFailed) as e:
        pindex.assemble(plan, Repository.parse(REPO), policy=policy)
    err = e.value
    digest = fake.events[0][1]
    assert fake.events == [("index by digest", digest)]
    assert err.message == (f"the tags of tiny-cpu-multi were not moved: the index "
                           f"{REPO}@{digest} is not signed as {policy.where} asks")
    assert f"signature: none: the registry holds no {cosign.sig_tag(digest)}" in err.facts
    assert f"cosign sign --key KEY {REPO}@{digest}" in err.hint
    assert f"cosign verify --key {KEYS / 'cosign.pub'} " in err.hint
    # Signed since (here as cosign would, by digest): the same run moves the tags.
    fake.layers[cosign.sig_tag(digest)] = [cosign.signature_layer(key, REPO, digest)]
    fake.layers[cosign.att_tag(digest)] = [
        cosign.attestation_layer(key, cosign.statement(REPO, digest, t, {"x": 1}))
        for t in ATTESTATION_TYPES.values()]
    done = pindex.assemble(plan, Repository.parse(REPO), policy=policy)
    assert done.digest == digest and fake.tags[plan.content_tag] == digest


def test_an_index_whose_content_tag_names_another_is_refused_before_anything(monkeypatch, plan,
                                                                            key):
    fake = FakeRegistry(monkeypatch, plan, key)
    fake.tags[plan.content_tag] = "sha256:" + "0" * 64
    with pytest.raises(JobFailed, match="already names another index; content tags never "
                                        "move"):
        pindex.assemble(plan, Repository.parse(REPO), signer=key)
    assert fake.events == []


# --- pull's refusal of the index names it -----------------------------------------------------

def test_enforce_names_the_index_found_and_expected(monkeypatch, key, other):
    held = {cosign.sig_tag(INDEX): [cosign.signature_layer(other, REPO, INDEX)]}
    monkeypatch.setattr(signstore, "fetch_layers", lambda repo, tag: held.get(tag))
    policy = SignPolicy(str(KEYS / "registries.yaml"), key="cosign.pub", attestations=())
    with pytest.raises(JobFailed) as e:
        signstore.enforce(Repository.parse(REPO), INDEX, policy, f"{REPO}:t-0123",
                          what="the index of t, ", sign_with="`imgbuild index t`")
    err = e.value
    assert err.message == (f"the index of t, {REPO}@{INDEX} is not signed as {policy.where} "
                           "asks; nothing was pulled")
    assert err.facts[0] == f"{REPO}:t-0123 names {INDEX}"
    assert err.facts[1].startswith("policy: signed by the key ")
    assert "a signature by another key" in err.facts[2]
    assert err.hint.startswith("pull an index the project's CI signed, or sign this one with "
                               "the policy's key (`imgbuild index t`)")


# --- the command passes the key, the policy and the commit on ---------------------------------

@pytest.mark.parametrize("how", ["flag", "env"])
def test_index_passes_the_opened_key_to_assemble(monkeypatch, how):
    """`imgbuild index --sign-key KEY` (or IMGBUILD_SIGN_KEY) reaches assemble as the opened
    key; without one, nothing signs (the stage stood in for: no registry)."""
    from imgbuild.cli.commands import index as index_cmd
    from imgbuild.cli.main import main

    got: list[dict] = []

    def stand_in(plan, repo, **kw):
        got.append(kw | {"target": plan.target})
        return pindex.Assembled(plan, INDEX, MANIFESTS, ())

    monkeypatch.setattr(index_cmd, "assemble", stand_in)
    monkeypatch.setattr(index_cmd.registry, "check_reachable", lambda repo: None)
    monkeypatch.setenv("COSIGN_PASSWORD", PASSWORD.decode())
    monkeypatch.delenv("IMGBUILD_SIGN_KEY", raising=False)
    argv = ["index", "tiny-cpu-multi", "--registry", "127.0.0.1:5000/acme/x"]
    if how == "flag":
        argv += ["--sign-key", str(KEYS / "cosign.key")]
    else:
        monkeypatch.setenv("IMGBUILD_SIGN_KEY", str(KEYS / "cosign.key"))
    assert main(argv) == 0
    [kw] = got
    assert kw["target"] == "tiny-cpu-multi" and kw["policy"] is None
    assert kw["signer"].source == str(KEYS / "cosign.key")
    got.clear()
    monkeypatch.delenv("IMGBUILD_SIGN_KEY", raising=False)
    assert main(argv[:4]) == 0
    assert got[0]["signer"] is None and got[0]["commit"] is None


def test_the_index_command_passes_the_registrys_policy_the_commit_and_the_pinned_plans(
        monkeypatch, capsys, tmp_path):
    """A project whose registry has a signed-by policy: the policy reaches the key check and
    assemble; the commit is read only when signing; the plans are the committed locks' (CI
    assembles what the repository pins: resolve=False); each target once; the report printed."""
    from imgbuild.cli.commands import index as index_cmd
    from imgbuild.cli.main import main

    proj = tmp_path / "p"
    (proj / "images").mkdir(parents=True)
    (proj / "imgbuild.yaml").write_text("# a project\n")
    repo = "127.0.0.1:5000/acme/x"
    (proj / "images" / "registries.yaml").write_text(
        f"registries:\n  - match: {repo}\n    signed-by: {{key: {KEYS / 'cosign.pub'}}}\n")
    monkeypatch.chdir(proj)
    for var in ("IMGBUILD_IMAGES", "IMGBUILD_LOCKFILES", "IMGBUILD_SIGN_KEY"):
        monkeypatch.delenv(var, raising=False)
    got: list[dict] = []
    plans: list[tuple] = []
    real_plan = index_cmd.make_index_plan

    def make_index_plan(ws, target, **kw):
        plans.append((target, kw))
        return real_plan(ws, target, **kw)

    def stand_in(plan, r, **kw):
        got.append(kw | {"repo": r.name})
        return pindex.Assembled(plan, INDEX, MANIFESTS, (f"{r.name}:x@{INDEX}",))

    pinged: list[str] = []
    monkeypatch.setattr(index_cmd, "make_index_plan", make_index_plan)
    monkeypatch.setattr(index_cmd, "assemble", stand_in)
    monkeypatch.setattr(index_cmd.registry, "check_reachable", lambda r: pinged.append(r.name))
    monkeypatch.setattr(index_cmd.attest, "git_commit",
                        lambda images: "c0ffee" if images == proj / "images" else "elsewhere")
    keys_checked: list = []
    real_key = index_cmd.signing_key
    monkeypatch.setattr(index_cmd, "signing_key", lambda spec, **kw: keys_checked.append(
        kw["policy"]) or real_key(spec, **kw))
    monkeypatch.setenv("COSIGN_PASSWORD", PASSWORD.decode())
    assert main(["index", "--all", "--registry", repo, "--sign-key",
                 str(KEYS / "cosign.key")]) == 0
    [kw] = got
    assert kw["repo"] == repo and pinged == [repo]
    assert kw["policy"] is not None and kw["policy"].key is not None
    assert kw["commit"] == "c0ffee" and kw["signer"] is not None
    assert keys_checked == [kw["policy"]]  # the key is checked against the same policy
    assert plans == [("tiny-cpu-multi", {"model": None, "repository": repo, "resolve": False})]
    said = capsys.readouterr().out
    assert "tiny-cpu-multi: index assembled" in said and f"{repo}:x@{INDEX}" in said
    # No key: no commit read.
    got.clear()
    plans.clear()
    monkeypatch.setattr(index_cmd.attest, "git_commit", lambda images: pytest.fail("read"))
    assert main(["index", "tiny-cpu-multi", "--registry", repo, "--model", "tiny-nvfp4",
                 "--json"]) == 0
    assert got[0]["commit"] is None and got[0]["signer"] is None
    assert plans[0][1]["model"] == "tiny-nvfp4"
    assert json.loads(capsys.readouterr().out)["indexes"][0]["digest"] == INDEX


@pytest.mark.parametrize("argv, message, fact_or_hint", [
    (["index"], "name the targets whose index to assemble, or --all",
     "multi-platform targets: tiny-cpu-multi"),
    (["index", "tiny-cpu"], "target 'tiny-cpu' names one platform: its image is its own tag",
     "an index is assembled for targets with several `platforms:`"),
])
def test_the_index_command_refuses_what_has_no_index(monkeypatch, capsys, argv, message,
                                                      fact_or_hint):
    from imgbuild.cli.commands import index as index_cmd
    from imgbuild.cli.main import main

    monkeypatch.setattr(index_cmd, "assemble", lambda *a, **k: pytest.fail("assembled"))
    assert main([*argv, "--registry", "127.0.0.1:5000/acme/x"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"error: {message}" in err and fact_or_hint in err


def test_the_index_command_needs_a_registry_host(monkeypatch, capsys):
    from imgbuild.cli.main import main

    assert main(["index", "tiny-cpu-multi", "--registry", "acme/x"]) == 2
    assert "--push needs a registry" in capsys.readouterr().err


def test_a_key_that_cannot_sign_is_exit_2_before_the_registry_is_asked(monkeypatch, capsys):
    from imgbuild.cli.commands import index as index_cmd
    from imgbuild.cli.main import main

    asked: list = []
    monkeypatch.setattr(index_cmd, "assemble", lambda *a, **k: asked.append("assemble"))
    monkeypatch.setattr(index_cmd.registry, "check_reachable", lambda r: asked.append("ping"))
    monkeypatch.setenv("COSIGN_PASSWORD", "not the password")
    assert main(["index", "tiny-cpu-multi", "--registry", "127.0.0.1:5000/acme/x",
                 "--sign-key", str(KEYS / "cosign.key")]) == 2
    assert asked == []
    err = " ".join(capsys.readouterr().err.split())
    assert "cannot be used" in err and "wrong password" in err and "Traceback" not in err


def test_a_multi_platform_build_signs_its_index_with_its_key(monkeypatch, plan, key):
    """build_target's last step (finish_index): once every platform passed and was pushed, the
    index is assembled with the build's key and policy (the stage stood in for)."""
    from types import SimpleNamespace

    from imgbuild.pipeline import build

    got: list[dict] = []
    monkeypatch.setattr(build, "assemble", lambda index, repo, **kw: got.append(kw))
    outcomes = tuple(SimpleNamespace(plan=p, gate=SimpleNamespace(open=True, held=None),
                                     built=SimpleNamespace(spliced=object()))
                     for p in plan.plans)  # spliced: nothing here to tag locally
    policy = SignPolicy("r.yaml", key="k.pub")
    build.finish_index(plan, outcomes, Repository.parse(REPO), push=True, client=None,
                       seconds_from=0.0, signer=key, policy=policy, commit="abc")
    assert got == [{"signer": key, "policy": policy, "commit": "abc", "progress": build.SILENT}]


# --- keyless and KMS: cosign signs the index (image/cosigncli.py, faked at its call) ---------

GHA = ("https://github.com/acme/serving/.github/workflows/images.yml@refs/heads/main",
       "https://token.actions.githubusercontent.com")
FORK = ("https://github.com/evil/serving/.github/workflows/images.yml@refs/heads/main", GHA[1])


def test_keyless_platform_images_must_all_name_one_identity():
    assert indexsign.identity_checks([GHA, GHA]) == [
        (("signature", True, f"keyless as {GHA[0]} (issuer {GHA[1]})"),)] * 2
    two = indexsign.identity_checks([GHA, FORK])
    assert [c[0][1] for c in two] == [False, False]
    assert two[1][0][2] == (f"keyless as {FORK[0]} (issuer {FORK[1]}); the platform images "
                            "name 2 identities, and one signs the index")
    none = indexsign.identity_checks([GHA, None])
    assert none[0][0][1] is True and none[1][0][1] is False
    assert none[1][0][2].startswith("none: no keyless signature")
    assert indexsign.identity_checks([]) == []


def test_the_index_must_be_signed_by_its_platforms_identity():
    assert indexsign.index_identity_refusal(GHA, GHA) is None
    assert indexsign.index_identity_refusal(FORK, GHA) == (
        f"the index was signed keyless as {FORK[0]} (issuer {FORK[1]}); its platform images "
        f"keyless as {GHA[0]} (issuer {GHA[1]})")
    assert "no keyless signature of the index" in indexsign.index_identity_refusal(None, GHA)
    # Same subject, another issuer: another identity.
    assert indexsign.index_identity_refusal((GHA[0], "https://accounts.google.com"), GHA)


class Cosign:
    """cosigncli's calls, faked: `sign` records the digest it signed and, keyless, leaves a
    certificate naming `identity` (what the registry would hold after real cosign); the
    identities the registry's `.sig` tags name, by digest."""

    def __init__(self, monkeypatch, identities: dict[str, tuple[str, str] | None],
                 identity=GHA, public: bytes | None = None):
        from imgbuild.image import cosigncli, keyless

        self.signed: list[tuple[str, dict]] = []
        self.identities = dict(identities)

        def sign(signer, ref, predicates, **_):
            digest = ref.split("@", 1)[1]
            self.signed.append((digest, predicates))
            if signer.key is None:
                self.identities[digest] = identity

        def who(repo, digest):
            got = self.identities.get(digest)
            return keyless.Identity((got[0],), got[1]) if got else None

        monkeypatch.setattr(cosigncli, "sign", sign)
        monkeypatch.setattr(signstore, "keyless_identity", who)
        if public is not None:
            monkeypatch.setattr(cosigncli, "public_key_pem", lambda signer, env=None: public)


def _platform_digests(plan) -> list[str]:
    return ["sha256:" + hashlib.sha256(p.platform.encode()).hexdigest() for p in plan.plans]


def test_a_keyless_index_is_signed_over_platforms_of_its_identity(monkeypatch, plan):
    from imgbuild.image.cosigncli import Delegated

    fake = FakeRegistry(monkeypatch, plan, None)
    fc = Cosign(monkeypatch, dict.fromkeys(_platform_digests(plan), GHA))
    done = pindex.assemble(plan, Repository.parse(REPO), signer=Delegated("/bin/cosign", None))
    assert done.signed_by == {"method": "keyless", "subject": GHA[0], "issuer": GHA[1]}
    assert [d for d, _ in fc.signed] == [done.digest]
    # By digest, then signed (cosign), then the tags.
    assert fake.events == [("index by digest", done.digest), ("tag", plan.content_tag),
                           *[("tag", t) for t in plan.tags]]
    assert done.signed == (cosign.sig_tag(done.digest), cosign.att_tag(done.digest))
    assert set(fc.signed[0][1]) == {"cyclonedx", "slsaprovenance1"}  # cosign's --type names
    assert done.to_dict()["signed_by"] == done.signed_by


@pytest.mark.parametrize("found", [(GHA, FORK), (GHA, None)], ids=["two", "one-unsigned"])
def test_keyless_platforms_of_other_identities_refuse_the_index_before_anything(
        monkeypatch, plan, found):
    from imgbuild.image.cosigncli import Delegated

    fake = FakeRegistry(monkeypatch, plan, None)
    fc = Cosign(monkeypatch, dict(zip(_platform_digests(plan), found)))
    with pytest.raises(JobFailed) as e:
        pindex.assemble(plan, Repository.parse(REPO), signer=Delegated("/bin/cosign", None))
    err = e.value
    assert err.message == "the index of tiny-cpu-multi was not assembled; no tag moved"
    assert err.facts[-1] == indexsign.SAME_IDENTITY
    assert any(f.startswith("linux/arm64: ") for f in err.facts[:-1])
    assert err.hint.startswith("sign each platform's image in the same workflow")
    assert "--sign-key keyless" in err.hint and "cosign sign REPO@DIGEST" in err.hint
    assert fake.events == [] and fc.signed == []


def test_an_index_signed_by_another_identity_than_its_platforms_gets_no_tag(monkeypatch, plan):
    from imgbuild.image.cosigncli import Delegated

    fake = FakeRegistry(monkeypatch, plan, None)
    Cosign(monkeypatch, dict.fromkeys(_platform_digests(plan), GHA), identity=FORK)
    with pytest.raises(JobFailed) as e:
        pindex.assemble(plan, Repository.parse(REPO), signer=Delegated("/bin/cosign", None))
    err = e.value
    assert "is not signed by the identity that signed its platform images" in err.message
    assert err.facts[1] == indexsign.index_identity_refusal(FORK, GHA)
    assert [e for e in fake.events if e[0] == "tag"] == []


def test_a_kms_index_asks_its_platforms_for_the_kms_keys_signature(monkeypatch, plan, key,
                                                                   other):
    from imgbuild.image.cosigncli import Delegated

    kms = Delegated("/bin/cosign", "awskms:///alias/ci")
    public = (KEYS / "cosign.pub").read_bytes()  # the KMS key's public half, as cosign reads it
    fake = FakeRegistry(monkeypatch, plan, other)
    fc = Cosign(monkeypatch, {}, public=public)
    with pytest.raises(JobFailed) as e:
        pindex.assemble(plan, Repository.parse(REPO), signer=kms)
    assert e.value.facts[-1] == ("asked of each platform image: a signature by "
                                 f"{cosign.key_id(key.key.public_key())} (awskms:///alias/ci), "
                                 "the key that signs the index")
    assert fake.events == [] and fc.signed == []
    fake = FakeRegistry(monkeypatch, plan, key)  # the platforms signed by the KMS key
    done = pindex.assemble(plan, Repository.parse(REPO), signer=kms)
    assert done.signed_by == {"method": "kms", "key": "awskms:///alias/ci"}
    assert [d for d, _ in fc.signed] == [done.digest]
    assert fake.events[-1] == ("tag", plan.tags[-1])


def test_a_kms_key_cosign_cannot_show_is_refused_before_anything(monkeypatch, plan):
    from imgbuild.errors import InputError
    from imgbuild.image.cosigncli import Delegated

    fake = FakeRegistry(monkeypatch, plan, None)
    Cosign(monkeypatch, {}, public=b"not a key")
    with pytest.raises(InputError) as e:
        pindex.assemble(plan, Repository.parse(REPO),
                        signer=Delegated("/bin/cosign", "gcpkms://k"))
    assert "gcpkms://k gave no usable key" in e.value.message
    assert "nothing was written and no tag was moved" in e.value.facts
    assert fake.events == []


def test_a_build_with_a_kms_key_cosign_cannot_show_is_refused_before_the_build(monkeypatch):
    """The build's preflight and the index read a KMS key's public half the same way
    (signstore.kms_public_key): an answer that is no key is exit 2, said before any work."""
    from imgbuild.errors import InputError
    from imgbuild.image import cosigncli
    from imgbuild.image.cosigncli import Delegated
    from imgbuild.pipeline import build

    monkeypatch.setattr(cosigncli, "preflight", lambda spec: Delegated("/bin/cosign", spec))
    monkeypatch.setattr(cosigncli, "public_key_pem", lambda signer, env=None: b"not a key")
    policy = SignPolicy(str(KEYS / "registries.yaml"), key="cosign.pub")
    with pytest.raises(InputError) as e:
        build.signing_key("awskms:///alias/ci", push=True, policy=policy)
    assert e.value.message == "cosign public-key --key awskms:///alias/ci gave no usable key"
    assert "nothing was written and no tag was moved" in e.value.facts
    # Its public half is the policy's key: accepted, and it is cosign that will sign.
    monkeypatch.setattr(cosigncli, "public_key_pem",
                        lambda signer, env=None: (KEYS / "cosign.pub").read_bytes())
    assert build.signing_key("awskms:///alias/ci", push=True, policy=policy) == Delegated(
        "/bin/cosign", "awskms:///alias/ci")


def test_each_platform_images_identity_check_reads_whole():
    from imgbuild.image.indexsign import identity_checks, index_identity_refusal, said_who

    ci = ("https://github.com/acme/serving/.github/workflows/build.yml@refs/heads/main",
          "https://token.actions.githubusercontent.com")
    other = ("someone@example.com", None)
    assert said_who(other) == "keyless as someone@example.com (issuer not named)"
    assert identity_checks([ci, None]) == [
        (("signature", True, f"keyless as {ci[0]} (issuer {ci[1]})"),),
        (("signature", False, "none: no keyless signature (a certificate) of it is in the "
                              "registry"),)]
    assert identity_checks([ci, other]) == [
        (("signature", False, f"keyless as {ci[0]} (issuer {ci[1]}); the platform images name "
                              "2 identities, and one signs the index"),),
        (("signature", False, "keyless as someone@example.com (issuer not named); the platform "
                              "images name 2 identities, and one signs the index"),)]
    assert index_identity_refusal(None, ci) == ("the registry holds no keyless signature of "
                                                "the index (no certificate)")
    assert index_identity_refusal(other, ci) == (
        f"the index was signed keyless as someone@example.com (issuer not named); its "
        f"platform images keyless as {ci[0]} (issuer {ci[1]})")
    assert index_identity_refusal(ci, ci) is None and index_identity_refusal(ci, None) is None
