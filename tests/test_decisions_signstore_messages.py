"""What image/signstore.py tells a user, word for word, and what it hands on: every refusal's
message, facts and way out (a key that cannot be opened, a policy whose key or trust root
cannot be used, an image its policy refuses), and who signed, as sign_as reports it. The
registry and cosign are scripted, and each script checks it was asked about this very
repository: a call that lost its `repo` fails here, not only against a real registry
(tests/test_sign_interop.py signs and verifies there, with cosign itself)."""

from __future__ import annotations

from pathlib import Path

import pytest

from imgbuild.catalog.registries import SignPolicy
from imgbuild.errors import EXIT_FAILED, EXIT_INPUT, InputError, JobFailed
from imgbuild.image import cosign, cosigncli, keyless, registry, signstore
from imgbuild.image.registry import Repository

KEYS = Path(__file__).parent / "fixtures" / "cosign"
SIGSTORE = Path(__file__).parent / "data" / "sigstore"
PASSWORD = "imgbuild-test"
DIGEST = "sha256:" + "ab" * 32
OTHER = "sha256:" + "cd" * 32
REPO = "127.0.0.1:5000/acme/serving"
FIX = ("make one with `cosign generate-key-pair` (its cosign.key, with COSIGN_PASSWORD set "
       "to its password), then pass --sign-key cosign.key or --sign-key env://VAR")
GHA = "https://token.actions.githubusercontent.com"
WHO = "https://github.com/acme/serving/.github/workflows/ci.yml@refs/heads/main"


def said(e: pytest.ExceptionInfo) -> tuple[str, list[str], str | None, int]:
    return e.value.message, list(e.value.facts), e.value.hint, e.value.exit_code


@pytest.fixture(scope="module")
def key() -> cosign.SigningKey:
    return cosign.load_private_key((KEYS / "cosign.key").read_bytes(), PASSWORD.encode(),
                                   "cosign.key")


@pytest.fixture(scope="module")
def other() -> cosign.SigningKey:
    return cosign.load_private_key((KEYS / "other.key").read_bytes(), PASSWORD.encode(),
                                   "other.key")


# --- the signing key ----------------------------------------------------------------------------

def test_a_kms_key_is_no_file_and_says_who_signs_with_it():
    with pytest.raises(InputError) as e:
        signstore.load_signing_key("awskms:///alias/release", {})
    assert said(e) == (
        "awskms:///alias/release: a KMS key is no key file imgbuild can open",
        ["a KMS key signs only through its provider's API, which cosign calls (`--sign-key` in "
         "a build does)"], FIX, EXIT_INPUT)


def test_an_empty_variable_is_named(key):
    with pytest.raises(InputError) as e:
        signstore.load_signing_key("env://SIGN_PEM", {"SIGN_PEM": "  \n"})
    assert said(e) == ("--sign-key env://SIGN_PEM: $SIGN_PEM is empty or not set", [], FIX,
                       EXIT_INPUT)
    got = signstore.load_signing_key("env://SIGN_PEM", {
        "SIGN_PEM": (KEYS / "cosign.key").read_text(), "COSIGN_PASSWORD": PASSWORD})
    assert got.source == "$SIGN_PEM" and got.public_pem() == key.public_pem()


def test_an_unreadable_key_file_says_why(tmp_path):
    missing = tmp_path / "cosign.key"
    with pytest.raises(InputError) as e:
        signstore.load_signing_key(str(missing), {})
    assert said(e) == (f"cannot read the signing key {missing}",
                       ["FileNotFoundError: No such file or directory"], FIX, EXIT_INPUT)


def test_a_wrong_password_asks_for_the_password_and_a_wrong_file_for_a_key(tmp_path):
    pem = (KEYS / "cosign.key").read_bytes()
    with pytest.raises(cosign.KeyProblem) as why:
        cosign.load_private_key(pem, b"wrong", "x")
    with pytest.raises(InputError) as e:
        signstore.load_signing_key(str(KEYS / "cosign.key"), {"COSIGN_PASSWORD": "wrong"})
    assert said(e) == (f"the signing key {KEYS / 'cosign.key'} cannot be used", [str(why.value)],
                       "set COSIGN_PASSWORD to the key's password (`cosign generate-key-pair` "
                       "asked for it)", EXIT_INPUT)
    junk = tmp_path / "notes.txt"
    junk.write_text("not a key\n")
    with pytest.raises(InputError) as e:
        signstore.load_signing_key(str(junk), {"COSIGN_PASSWORD": PASSWORD})
    assert said(e) == (f"the signing key {junk} cannot be used",
                       ["not a PEM private key (no -----BEGIN ...----- line)"], FIX, EXIT_INPUT)


def test_a_plain_key_opens_without_a_password(tmp_path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    plain = ec.generate_private_key(ec.SECP256R1())
    path = tmp_path / "plain.pem"
    path.write_bytes(plain.private_bytes(serialization.Encoding.PEM,
                                         serialization.PrivateFormat.PKCS8,
                                         serialization.NoEncryption()))
    got = signstore.load_signing_key(str(path), {})  # no COSIGN_PASSWORD at all
    assert got.source == str(path)
    assert got.key.private_numbers() == plain.private_numbers()


# --- the policy's key and trust root ------------------------------------------------------------

def test_a_policy_key_that_cannot_be_read_or_used_says_which_and_how(tmp_path):
    where = str(tmp_path / "registries.yaml")
    with pytest.raises(InputError) as e:
        signstore.policy_key(SignPolicy(where, key="keys/cosign.pub"))
    assert said(e) == (
        f"{where}: signed-by.key: cannot read {tmp_path / 'keys' / 'cosign.pub'}",
        ["FileNotFoundError: No such file or directory"],
        "give the public key's path (from the directory of registries.yaml, or absolute) or "
        "its PEM (`cosign public-key --key cosign.key`)", EXIT_INPUT)
    inline = "-----BEGIN PUBLIC KEY-----\nnot base64\n-----END PUBLIC KEY-----\n"
    with pytest.raises(cosign.KeyProblem) as why:
        cosign.load_public_key(inline.encode())
    with pytest.raises(InputError) as e:
        signstore.policy_key(SignPolicy(where, key=inline))
    assert said(e) == (f"{where}: signed-by.key: the inline PEM cannot be used",
                       [str(why.value)], "the key cosign.pub `cosign generate-key-pair` wrote",
                       EXIT_INPUT)
    with pytest.raises(InputError) as e:
        signstore.policy_key(SignPolicy(str(KEYS / "registries.yaml"), key="cosign.key"))
    assert e.value.message == (f"{KEYS / 'registries.yaml'}: signed-by.key: "
                               f"{KEYS / 'cosign.key'} cannot be used")


TRUST_FIX = ("name a Sigstore trusted_root.json in signed-by.keyless.trust-root (a path from the "
             "directory of registries.yaml, or absolute): Sigstore's public one is the "
             "trusted_root.json target of its TUF repository, which `cosign initialize` caches "
             "under ~/.sigstore/root/; a private Fulcio's is made with `cosign trusted-root "
             "create`")


def test_a_keyless_policy_without_a_usable_trust_root_is_exit_2_naming_it(tmp_path):
    where = str(tmp_path / "registries.yaml")
    bare = SignPolicy(where, issuer=GHA, subject=WHO)
    with pytest.raises(InputError) as e:
        signstore.policy_trust_root(bare)
    assert said(e) == (f"{where}: signed-by.keyless has no trust-root",
                       [cosign.no_trust_root(bare), "Sigstore's public trust root is fetched "
                        "over the network (TUF), which imgbuild does not do"], TRUST_FIX,
                       EXIT_INPUT)
    with pytest.raises(InputError) as e:
        signstore.policy_trust_root(SignPolicy(where, issuer=GHA, subject=WHO,
                                               trust_root="root.json"))
    assert said(e) == (f"{where}: signed-by.keyless.trust-root: cannot read "
                       f"{tmp_path / 'root.json'}",
                       ["FileNotFoundError: No such file or directory"], TRUST_FIX, EXIT_INPUT)
    (tmp_path / "root.json").write_text("{}")
    with pytest.raises(keyless.TrustRootProblem) as why:
        keyless.load_trust_root(b"{}", str(tmp_path / "root.json"))
    with pytest.raises(InputError) as e:
        signstore.policy_trust_root(SignPolicy(where, issuer=GHA, subject=WHO,
                                               trust_root="root.json"))
    assert said(e) == (f"{where}: signed-by.keyless.trust-root: {tmp_path / 'root.json'} "
                       "cannot be used", [str(why.value)], TRUST_FIX, EXIT_INPUT)


def test_a_usable_trust_root_is_read_from_the_policys_path():
    policy = SignPolicy(str(SIGSTORE / "registries.yaml"), issuer=GHA, subject=WHO,
                        trust_root="trusted_root_pgi.json")
    root = signstore.policy_trust_root(policy)
    assert root.source == str(SIGSTORE / "trusted_root_pgi.json") and root.cas


# --- enforce: the refusal a pull meets ----------------------------------------------------------

@pytest.fixture()
def held(monkeypatch):
    """The registry's `.sig`/`.att` tags of REPO; asked about another repository, it fails."""
    repo = Repository.parse(REPO)
    tags: dict[str, list[cosign.Layer]] = {}

    def fetch_layers(asked, tag):
        assert asked is repo, f"asked {asked!r}, not {REPO}"
        read.append(tag)
        return tags.get(tag)
    read: list[str] = []
    monkeypatch.setattr(signstore, "fetch_layers", fetch_layers)
    return repo, tags, read


def test_a_key_policy_refusal_names_the_policy_each_failed_check_and_cosigns_command(held,
                                                                                     other):
    repo, tags, _ = held
    tags[cosign.sig_tag(DIGEST)] = [cosign.signature_layer(other, REPO, DIGEST)]
    policy = SignPolicy(str(KEYS / "registries.yaml"), key="cosign.pub",
                        attestations=("cyclonedx", "slsaprovenance1"))
    found, _ = signstore.checks(repo, DIGEST, policy)
    bad = [f"{c}: {d}" for c, ok, d in found if not ok]
    with pytest.raises(JobFailed) as e:
        signstore.enforce(repo, DIGEST, policy, f"{REPO}:t")
    assert said(e) == (
        f"{REPO}@{DIGEST} is not signed as {KEYS / 'registries.yaml'} asks; nothing was pulled",
        [f"{REPO}:t names {DIGEST}",
         f"policy: signed by the key {KEYS / 'cosign.pub'}, attestations cyclonedx, "
         "slsaprovenance1", *bad],
        "pull an image the project's CI signed, or sign this one with the policy's key "
        "(`imgbuild TARGET --push --sign-key KEY`); cosign checks the same: "
        + cosign.cosign_commands(policy, str(KEYS / "cosign.pub"), f"{REPO}@{DIGEST}",
                                 plain_http=True)[0], EXIT_FAILED)
    assert len(bad) == 3  # the signature and both attestations


def test_an_inline_key_without_attestations_and_an_index(held, other):
    repo, tags, _ = held
    tags[cosign.sig_tag(DIGEST)] = [cosign.signature_layer(other, REPO, DIGEST)]
    policy = SignPolicy("/etc/imgbuild/registries.yaml",
                        key=(KEYS / "cosign.pub").read_text(), attestations=())
    with pytest.raises(JobFailed) as e:
        signstore.enforce(repo, DIGEST, policy, f"{REPO}:t", what="the index ",
                          sign_with="`imgbuild index --sign-key KEY`")
    message, facts, hint, _ = said(e)
    assert message.startswith(f"the index {REPO}@{DIGEST} is not signed as ")
    assert facts[1] == "policy: signed by the key (inline PEM)"
    assert hint.startswith("pull an index the project's CI signed, or sign this one with the "
                           "policy's key (`imgbuild index --sign-key KEY`); cosign checks the "
                           "same: ")


def test_a_keyless_refusal_names_who_and_the_trust_root(held, key):
    repo, tags, _ = held
    tags[cosign.sig_tag(DIGEST)] = [cosign.signature_layer(key, REPO, DIGEST)]
    policy = SignPolicy(str(SIGSTORE / "registries.yaml"), issuer=GHA, subject=WHO,
                        trust_root="trusted_root_pgi.json", attestations=())
    with pytest.raises(JobFailed) as e:
        signstore.enforce(repo, DIGEST, policy, f"{REPO}:t")
    _, facts, hint, _ = said(e)
    # Judged against the policy's trust root: a key's signature is no certificate's.
    path = SIGSTORE / "trusted_root_pgi.json"
    root = keyless.load_trust_root(path.read_bytes(), str(path))
    judged = cosign.judge(policy, DIGEST, tags[cosign.sig_tag(DIGEST)], None, None, root)
    assert facts[2:] == [f"{c}: {d}" for c, ok, d in judged if not ok]
    assert "trust-root" not in facts[2]
    assert facts[1] == (f"policy: keyless, {WHO} (issuer {GHA}), trust root "
                        f"{SIGSTORE / 'trusted_root_pgi.json'}")
    assert hint.startswith(f"pull an image the project's CI signed, or sign this one as {WHO} "
                           "(`--sign-key keyless` in that workflow); cosign checks the same: ")


def test_what_the_policy_accepts_is_returned_and_no_policy_reads_nothing(held, key):
    repo, tags, read = held
    tags[cosign.sig_tag(DIGEST)] = [cosign.signature_layer(key, REPO, DIGEST)]
    policy = SignPolicy(str(KEYS / "registries.yaml"), key="cosign.pub", attestations=())
    assert [(c, ok) for c, ok, _ in signstore.enforce(repo, DIGEST, policy, "x")] == [
        ("signature", True)]
    assert read == [cosign.sig_tag(DIGEST)]  # no attestation asked for: `.att` is not read
    assert signstore.enforce(Repository.parse("elsewhere/x"), DIGEST, None, "x") == []


# --- sign_as: who signed ------------------------------------------------------------------------

@pytest.fixture()
def cosign_cli(monkeypatch):
    """cosign's `sign`/`attest`, scripted: what it was asked, for REPO only."""
    repo = Repository.parse("registry.example:5000/acme/serving")
    asked = []

    def sign(signer, ref, predicates, *, plain_http, cacert=None, env=None):
        asked.append((ref, dict(predicates), plain_http, cacert))

    def ca_file(r):
        assert r is repo
        return "/etc/docker/certs.d/registry.example:5000/ca.crt"
    monkeypatch.setattr(cosigncli, "sign", sign)
    monkeypatch.setattr(registry, "ca_file", ca_file)
    return repo, asked


def test_a_key_here_signs_here_and_says_which_key(monkeypatch, key):
    repo = Repository.parse(REPO)

    def sign(asked, digest, k, predicates):
        assert (asked, digest, k) == (repo, DIGEST, key)
        return ["sig-tag"]
    monkeypatch.setattr(signstore, "sign", sign)
    assert signstore.sign_as(repo, DIGEST, key, {}) == (["sig-tag"],
                                                        {"method": "key", "key": "cosign.key"})


def test_a_kms_key_signs_through_cosign_with_the_registrys_ca(cosign_cli):
    repo, asked = cosign_cli
    kms = cosigncli.Delegated("/usr/bin/cosign", "awskms:///alias/release")
    predicates = {"https://cyclonedx.org/bom": {"bom": 1}}
    assert signstore.sign_as(repo, DIGEST, kms, predicates) == (
        [cosign.sig_tag(DIGEST), cosign.att_tag(DIGEST)],
        {"method": "kms", "key": "awskms:///alias/release"})
    assert asked == [(f"{repo.name}@{DIGEST}", {"cyclonedx": {"bom": 1}}, False,
                      "/etc/docker/certs.d/registry.example:5000/ca.crt")]
    assert signstore.sign_as(repo, DIGEST, kms, {})[0] == [cosign.sig_tag(DIGEST)]


def test_keyless_reports_the_identity_read_back_or_stops_naming_cosign_3(cosign_cli,
                                                                        monkeypatch):
    repo, asked = cosign_cli
    signer = cosigncli.Delegated("/opt/cosign-3.0.1", None)
    read = {}

    def keyless_identity(r, digest):
        assert (r, digest) == (repo, DIGEST)
        return read.get(digest)
    monkeypatch.setattr(signstore, "keyless_identity", keyless_identity)
    with pytest.raises(JobFailed) as e:
        signstore.sign_as(repo, DIGEST, signer, {})
    assert said(e) == (
        f"cosign signed {repo.name}@{DIGEST[:19]}… keyless, and the registry holds no "
        f"certificate-bearing signature of it under {cosign.sig_tag(DIGEST)}; no tag moved",
        ["cosign: /opt/cosign-3.0.1", "imgbuild reads the `.sig` tags cosign 2 writes; cosign "
         "3 writes Sigstore bundles as OCI referrers"],
        "sign with cosign 2.x (sigstore/cosign-installer: cosign-release v2.5.0, or "
        "IMGBUILD_COSIGN)", EXIT_FAILED)
    read[DIGEST] = keyless.Identity((WHO,), GHA)
    assert signstore.sign_as(repo, DIGEST, signer, {}) == (
        [cosign.sig_tag(DIGEST)], {"method": "keyless", "subject": WHO, "issuer": GHA})
