"""Signing through the cosign binary (image/cosigncli.py), decided on plain data: which
`--sign-key` means which signer, the command lines, the preflight before anything is built, and
how cosign's failure reads and stops the tags. No Docker, no registry: the cosign here is a
small script of the test's own (the real one signs in tests/test_cosign_delegation.py)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from imgbuild.catalog.registries import SignPolicy
from imgbuild.errors import EXIT_ENV, EXIT_INPUT, EnvError, InputError
from imgbuild.image import cosigncli
from imgbuild.image.cosigncli import Delegated
from imgbuild.pipeline.build import signer_refusal, signing_key

KEYS = Path(__file__).parent / "fixtures" / "cosign"
REF = "127.0.0.1:5000/acme/serving@sha256:" + "ab" * 32
GHA = {"ACTIONS_ID_TOKEN_REQUEST_URL": "https://token.actions.invalid/x?a=1",
       "ACTIONS_ID_TOKEN_REQUEST_TOKEN": "t"}


def fake_cosign(tmp_path: Path, body: str, name: str = "cosign") -> Path:
    """A `cosign` that runs `body` (bash), its argv logged one JSON line per call."""
    log = tmp_path / f"{name}.log"
    p = tmp_path / "bin" / name
    p.parent.mkdir(exist_ok=True)
    p.write_text("#!/bin/bash\n"
                 f"python3 -c 'import json,sys; print(json.dumps(sys.argv[1:]))' \"$@\" >> {log}\n"
                 + body + "\n")
    p.chmod(p.stat().st_mode | stat.S_IEXEC)
    return p


def calls(tmp_path: Path, name: str = "cosign") -> list[list[str]]:
    log = tmp_path / f"{name}.log"
    return [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []


VERSION_2 = 'if [ "$1" = version ]; then echo \'{"gitVersion": "v2.5.0"}\'; exit 0; fi'


def test_which_spec_means_which_signer():
    assert cosigncli.delegated_kind("keyless") == "keyless"
    for uri in ("awskms:///alias/imgbuild", "gcpkms://projects/p/locations/l/keyRings/r/"
                "cryptoKeys/k/versions/1", "azurekms://v.vault.azure.net/k",
                "hashivault://imgbuild", "k8s://ns/secret", "gitlab://group/project",
                "pkcs11:token=t;object=k"):
        assert cosigncli.delegated_kind(uri) == "kms", uri
    for spec in ("cosign.key", "/keys/cosign.key", "env://COSIGN_PRIVATE_KEY", "Keyless",
                 "keyless.key"):
        assert cosigncli.delegated_kind(spec) is None, spec


def test_the_command_lines():
    keyless = Delegated("/usr/bin/cosign", None)
    kms = Delegated("/usr/bin/cosign", "awskms:///alias/k")
    assert cosigncli.sign_argv(keyless, REF, plain_http=False) == [
        "/usr/bin/cosign", "sign", "--yes", REF]
    assert cosigncli.sign_argv(kms, REF, plain_http=True) == [
        "/usr/bin/cosign", "sign", "--yes", "--key", "awskms:///alias/k", "--tlog-upload=false",
        "--allow-insecure-registry", "--allow-http-registry", REF]
    assert cosigncli.attest_argv(keyless, REF, "cyclonedx", "/tmp/d/cyclonedx.json",
                                 plain_http=False, cacert="/etc/docker/certs.d/r/ca.crt") == [
        "/usr/bin/cosign", "attest", "--yes", "--registry-cacert",
        "/etc/docker/certs.d/r/ca.crt", "--type", "cyclonedx", "--predicate",
        "/tmp/d/cyclonedx.json", REF]
    assert cosigncli.public_key_argv(kms) == ["/usr/bin/cosign", "public-key", "--key",
                                              "awskms:///alias/k"]
    # A plain-HTTP registry trusts no CA file; only loopback or named-insecure ones are.
    assert cosigncli.registry_flags(True, "/ca.crt") == ["--allow-insecure-registry",
                                                         "--allow-http-registry"]
    assert cosigncli.registry_flags(False, None) == []
    assert keyless.kind == "keyless" and kms.kind == "kms" and kms.source == "awskms:///alias/k"


def test_cosign_releases():
    assert cosigncli.version_of('{"gitVersion": "v2.5.0"}') == (2, 5, 0)
    assert cosigncli.version_of('{"gitVersion": "devel"}') is None  # Debian's build
    assert cosigncli.version_of("GitVersion:    v3.0.2\n") == (3, 0, 2)
    assert cosigncli.version_refusal((2, 5, 0)) is None
    assert cosigncli.version_refusal(None) is None
    assert "OCI referrers" in cosigncli.version_refusal((3, 0, 2))


def test_ambient_identity():
    assert cosigncli.ambient_identity(GHA, False) == "GitHub Actions' OIDC token"
    # GitHub sets both only where the job has `permissions: id-token: write`.
    assert cosigncli.ambient_identity({"ACTIONS_ID_TOKEN_REQUEST_TOKEN": "t"}, False) is None
    assert cosigncli.ambient_identity({"SIGSTORE_ID_TOKEN": "ey.."}, False) == "SIGSTORE_ID_TOKEN"
    assert cosigncli.ambient_identity({}, True) == cosigncli.TOKEN_FILE
    assert cosigncli.ambient_identity({}, False) is None


def test_a_signer_the_policy_could_never_accept_is_refused_before_the_build(monkeypatch):
    by_key = SignPolicy(str(KEYS / "registries.yaml"), key="cosign.pub")
    by_ci = SignPolicy("registries.yaml", issuer="https://token.actions.githubusercontent.com",
                       subject="https://github.com/acme/x/.github/workflows/images.yml@refs/"
                               "heads/main", trust_root="root.json")
    assert signer_refusal("key", None) is None and signer_refusal("keyless", by_ci) is None
    assert signer_refusal("kms", by_key) is None
    assert "keyless signature by https://github.com/acme" in signer_refusal("kms", by_ci)
    assert "signature by its key" in signer_refusal("keyless", by_key)
    monkeypatch.setenv("COSIGN_PASSWORD", "imgbuild-test")
    for spec, policy in (("keyless", by_key), (str(KEYS / "cosign.key"), by_ci),
                         ("awskms:///alias/k", by_ci)):
        with pytest.raises(InputError, match="cannot make a signature") as e:
            signing_key(spec, push=True, policy=policy)
        assert e.value.exit_code == EXIT_INPUT


def test_preflight_finds_cosign_or_says_how_to_get_it(tmp_path, monkeypatch):
    env = {"PATH": str(tmp_path / "empty")} | GHA
    with pytest.raises(EnvError, match="signs through the cosign binary, and there is none") as e:
        cosigncli.preflight("keyless", env)
    assert e.value.exit_code == EXIT_ENV
    assert "no `cosign` on PATH" in e.value.facts[0] and "cosign-installer" in e.value.hint
    with pytest.raises(EnvError) as e:
        cosigncli.preflight("keyless", env | {"IMGBUILD_COSIGN": str(tmp_path / "nope")})
    assert "is not an executable file" in e.value.facts[0]
    # The build asks before anything is built: `signing_key` is what build_platform calls
    # first, with the process's environment.
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv("IMGBUILD_COSIGN", raising=False)
    with pytest.raises(EnvError, match="there is none"):
        signing_key("awskms:///alias/k", push=True, policy=None)

    c = fake_cosign(tmp_path, VERSION_2)
    got = cosigncli.preflight("awskms:///alias/k", {"PATH": str(c.parent)})
    assert got == Delegated(str(c), "awskms:///alias/k")
    assert cosigncli.preflight("keyless", {"IMGBUILD_COSIGN": str(c)} | GHA) == Delegated(
        str(c), None)
    # keyless with no OIDC token this job can hand over (no id-token: write)
    with pytest.raises(EnvError, match="no OIDC identity") as e:
        cosigncli.preflight("keyless", {"IMGBUILD_COSIGN": str(c)})
    assert "id-token: write" in e.value.hint
    three = fake_cosign(tmp_path, "echo '{\"gitVersion\": \"v3.0.2\"}'", name="cosign3")
    with pytest.raises(EnvError, match="cannot sign for imgbuild") as e:
        cosigncli.preflight("keyless", {"IMGBUILD_COSIGN": str(three)} | GHA)
    assert "cosign-release" in e.value.hint


def test_cosign_signs_then_attests_each_predicate_from_a_private_directory(tmp_path):
    # The fake cosign keeps a copy of each predicate and the mode of its directory.
    c = fake_cosign(tmp_path, VERSION_2 + "\n"
                    'for i in "$@"; do if [ "$prev" = --predicate ]; then '
                    f'stat -c %a "$(dirname "$i")" >> {tmp_path}/modes; '
                    f'cp "$i" {tmp_path}/; fi; prev=$i; done')
    signer = Delegated(str(c), None)
    preds = {"cyclonedx": {"bomFormat": "CycloneDX"}, "slsaprovenance1": {"buildDefinition": {}}}
    cosigncli.sign(signer, REF, preds, plain_http=True)
    got = calls(tmp_path)
    assert [a[:2] for a in got] == [["sign", "--yes"], ["attest", "--yes"], ["attest", "--yes"]]
    assert [a[a.index("--type") + 1] for a in got[1:]] == ["cyclonedx", "slsaprovenance1"]
    assert all(a[-1] == REF and "--allow-http-registry" in a for a in got)
    assert (tmp_path / "modes").read_text().split() == ["700", "700"]
    assert json.loads((tmp_path / "cyclonedx.json").read_text()) == preds["cyclonedx"]
    assert not Path(got[1][got[1].index("--predicate") + 1]).parent.exists()  # removed after
    with pytest.raises(InputError, match="by digest"):
        cosigncli.sign(signer, "127.0.0.1:5000/acme/serving:latest", {}, plain_http=True)


def test_cosigns_failure_shows_its_stderr_tail(tmp_path, monkeypatch):
    c = fake_cosign(tmp_path, VERSION_2 + "\n"
                    'for i in $(seq 1 200); do echo "noise line $i" >&2; done\n'
                    'echo "Error: signing: getting signer: UNAUTHORIZED: the KMS said no" >&2\n'
                    "exit 7")
    monkeypatch.setenv("COSIGN_PASSWORD", "never-on-argv")
    with pytest.raises(EnvError) as e:
        cosigncli.sign(Delegated(str(c), "awskms:///alias/k"), REF, {}, plain_http=False)
    err = e.value
    assert err.exit_code == EXIT_ENV
    assert err.message == "cosign sign failed: nothing was signed by this run and no tag moved"
    assert err.facts[0] == f"{c} sign --yes --key awskms:///alias/k --tlog-upload=false {REF}"
    assert err.facts[1] == "cosign exit status 7"
    assert err.facts[-1] == "Error: signing: getting signer: UNAUTHORIZED: the KMS said no"
    assert "noise line 1\n" not in "\n".join(err.facts)  # the tail, not all of it
    assert "never-on-argv" not in json.dumps(calls(tmp_path))
    assert "awskms" in err.hint and "a rerun signs it" in err.hint


@pytest.mark.parametrize("fails", [False, True])
def test_a_cosign_signature_comes_before_the_tags_and_a_failure_moves_none(
        tmp_path, monkeypatch, fails):
    """publish() with the registry faked and a real process for cosign: the delegated signer
    runs where the key signs (after the gate, before the moving tags), and its failure moves
    no tag, here or in the registry."""
    from imgbuild.image import attest
    from imgbuild.image import registry as reg
    from imgbuild.image.registry import Repository
    from imgbuild.image.smoke import SmokeReport
    from imgbuild.pipeline import build
    from imgbuild.plan.decide import make_plan

    from .conftest import checkout_workspace
    from .test_decisions_image_cosign import DIGEST, _Engine

    repo_name = "127.0.0.1:5000/acme/serving"
    plan = make_plan(checkout_workspace(), "tiny-cpu", repository=repo_name)
    events: list = []
    monkeypatch.setattr(reg, "manifest_digest", lambda repo, tag: DIGEST)
    monkeypatch.setattr(build, "held_is_this_image", lambda *a, **k: True)
    monkeypatch.setattr(reg, "image_config", lambda repo, d: ({"layers": []}, {}))
    monkeypatch.setattr(reg, "fetch_report", lambda repo, d: {"ok": True})
    monkeypatch.setattr(reg, "fetch_artifact", lambda repo, tag, kind: (
        "sha256:1", {"bomFormat": "CycloneDX"} if "sbom" in tag else {"predicate": {"p": 1}}))
    monkeypatch.setattr(attest, "stored", lambda repo, d: True)
    monkeypatch.setattr(attest, "verify", lambda repo, d, **k: attest.Verification(
        repo_name, d, (("signature", True, ""),)))
    monkeypatch.setattr(reg, "tag_manifest", lambda repo, digest, tag: events.append(
        ("registry", tag)) or digest)
    c = fake_cosign(tmp_path, VERSION_2 + ("\necho 'Error: KMS unreachable' >&2; exit 1"
                                           if fails else ""))
    signer = Delegated(str(c), "hashivault://imgbuild")
    gate = build.Gate(SmokeReport(plan.ref(), True, (), 1.0, {"ok": True}, "sha256:1"), True)
    repo = Repository.parse(repo_name)
    if fails:
        with pytest.raises(EnvError, match="cosign sign failed") as e:
            build.publish(plan, gate, _Engine(events), repo, push=True, signer=signer)
        assert "Error: KMS unreachable" in e.value.facts
        assert events == []  # no tag moved, here or in the registry
        return
    got = build.publish(plan, gate, _Engine(events), repo, push=True, signer=signer)
    assert [a[0] for a in calls(tmp_path)] == ["sign", "attest", "attest"]
    assert len(events) == 2 * len(plan.tags)
    assert got.signed_by == {"method": "kms", "key": "hashivault://imgbuild"}
    assert got.signed == (DIGEST.replace(":", "-") + ".sig", DIGEST.replace(":", "-") + ".att")


def test_the_build_report_says_who_signed():
    from imgbuild.pipeline.build import said_by

    assert said_by({"method": "keyless", "subject": "https://github.com/acme/x/.github/"
                    "workflows/images.yml@refs/heads/main",
                    "issuer": "https://token.actions.githubusercontent.com"}) == (
        "keyless as https://github.com/acme/x/.github/workflows/images.yml@refs/heads/main "
        "(issuer https://token.actions.githubusercontent.com)")
    assert said_by({"method": "kms", "key": "awskms:///alias/k"}) == \
        "with the KMS key awskms:///alias/k"
    assert said_by({"method": "key", "key": "cosign.key"}) == "with the key cosign.key"
    assert said_by(None) == "not signed by this run"


def test_cosign_reads_the_registry_credentials_imgbuild_reads():
    """Nothing secret goes on cosign's command line: it inherits the environment, so
    DOCKER_CONFIG (or ~/.docker/config.json) is the same file imgbuild's registry client reads
    (the real cosign pushing with them: tests/test_cosign_delegation.py)."""
    argv = cosigncli.sign_argv(Delegated("cosign", "awskms:///k"), REF, plain_http=False)
    assert not any(a.startswith(("--registry-username", "--registry-password",
                                 "--registry-token", "--identity-token")) for a in argv)
    assert os.environ.get("COSIGN_PASSWORD", "") not in " ".join(argv) or \
        not os.environ.get("COSIGN_PASSWORD")


# --- word for word ------------------------------------------------------------------------------

INSTALL = ("install cosign 2.x (GitHub Actions: sigstore/cosign-installer with cosign-release "
           "v2.5.0; Debian trixie: the cosign package) or name it in IMGBUILD_COSIGN")
SIGSTORE_OWN = ("a keyless or KMS signature is made by Sigstore's own client; imgbuild signs "
                "only with a key file or env://VAR itself")


def test_preflights_refusals_word_for_word(tmp_path, monkeypatch):
    with pytest.raises(EnvError) as e:
        cosigncli.preflight("keyless", {"PATH": str(tmp_path / "empty")} | GHA)
    assert (e.value.message, e.value.facts, e.value.hint) == (
        "--sign-key keyless signs through the cosign binary, and there is none",
        ["no `cosign` on PATH", SIGSTORE_OWN], INSTALL)
    plain = tmp_path / "not-executable"
    plain.write_text("")
    with pytest.raises(EnvError) as e:
        cosigncli.preflight("awskms:///alias/k", {"IMGBUILD_COSIGN": str(plain)})
    assert e.value.facts == [f"IMGBUILD_COSIGN={plain} is not an executable file", SIGSTORE_OWN]
    # An executable directory is no cosign either.
    assert cosigncli.find({"IMGBUILD_COSIGN": str(tmp_path)}) is None
    three = fake_cosign(tmp_path, "echo '{\"gitVersion\": \"v3.0.2\"}'", name="cosign3")
    with pytest.raises(EnvError) as e:
        cosigncli.preflight("keyless", {"IMGBUILD_COSIGN": str(three)} | GHA)
    assert (e.value.message, e.value.hint) == (
        f"{three} cannot sign for imgbuild",
        "install cosign 2.x (sigstore/cosign-installer: cosign-release v2.5.0), or name one in "
        "IMGBUILD_COSIGN")
    assert e.value.facts == ["cosign 3.0.2 writes its signatures as Sigstore bundles (OCI "
                             "referrers), not the `.sig`/`.att` tags of cosign 2 that imgbuild "
                             "reads"]
    assert calls(tmp_path, "cosign3") == [["version", "--json"]]
    two = fake_cosign(tmp_path, VERSION_2)
    monkeypatch.setattr(cosigncli, "TOKEN_FILE", str(tmp_path / "no-token"))
    with pytest.raises(EnvError) as e:
        cosigncli.preflight("keyless", {"IMGBUILD_COSIGN": str(two)})
    assert (e.value.message, e.value.facts, e.value.hint) == (
        "--sign-key keyless: this job has no OIDC identity cosign can take without a browser",
        ["no ACTIONS_ID_TOKEN_REQUEST_URL/TOKEN (GitHub Actions), no SIGSTORE_ID_TOKEN, no "
         f"{tmp_path / 'no-token'}"],
        "in GitHub Actions give the job `permissions: id-token: write`; elsewhere put the CI's "
        "OIDC token (audience sigstore) in SIGSTORE_ID_TOKEN, or sign with a key "
        "(--sign-key cosign.key)")
    # A token file the CI left is an identity too.
    (tmp_path / "no-token").write_text("eyJ...")
    assert cosigncli.preflight("keyless", {"IMGBUILD_COSIGN": str(two)}) == Delegated(
        str(two), None)


def test_cosigns_failure_hint_for_each_signer_and_a_cosign_that_cannot_start(tmp_path):
    keyless = cosigncli.failed("cosign sign", ["cosign", "sign", REF], 1, "\n  Error: no\n\n",
                               Delegated("/c", None))
    assert (keyless.message, keyless.facts, keyless.hint) == (
        "cosign sign failed: nothing was signed by this run and no tag moved",
        [f"cosign sign {REF}", "cosign exit status 1", "Error: no"],
        "keyless signing needs the job's OIDC token (GitHub Actions: `permissions: id-token: "
        "write`) and Fulcio and Rekor reachable (sigstore.dev); the content tag stays pushed, "
        "and a rerun signs it")
    kms = cosigncli.failed("cosign attest", ["c"], 2, "", Delegated("/c", "gcpkms://p/k:v1"))
    assert kms.hint == ("check that the credentials of gcpkms cosign reads from the environment "
                        "may sign with that key; the content tag stays pushed, and a rerun "
                        "signs it")
    with pytest.raises(EnvError) as e:
        cosigncli.run([str(tmp_path / "gone"), "version"], "cosign version",
                      Delegated("/c", None), {})
    assert e.value.facts[1:] == ["cosign exit status -1",
                                 "FileNotFoundError: No such file or directory"]
    assert cosigncli.tail("x" * 10, n=4) == "...xxxx" and cosigncli.tail(" ab \n") == "ab"
    assert cosigncli.tail("xxxx", n=4) == "xxxx"  # as long as the limit: all of it


def test_a_cosign_that_does_not_answer_is_stopped_and_said_so(tmp_path, monkeypatch):
    slow = fake_cosign(tmp_path, "sleep 3; exit 0", name="slow")
    monkeypatch.setattr(cosigncli, "TIMEOUT_S", 0.5)
    with pytest.raises(EnvError) as e:
        cosigncli.run([str(slow), "sign", REF], "cosign sign", Delegated(str(slow), None), {})
    assert e.value.message == ("cosign sign failed: nothing was signed by this run and no tag "
                               "moved")
    assert e.value.facts == [f"{slow} sign {REF}", "cosign exit status -1",
                             "(no answer in 0.5 s)"]
    assert "OIDC token" in e.value.hint  # the keyless signer's way out


def test_preflights_failing_cosign_is_said_with_the_signers_way_out(tmp_path):
    broken = fake_cosign(tmp_path, "echo 'Error: no config' >&2; exit 4", name="broken")
    with pytest.raises(EnvError) as e:
        cosigncli.preflight("awskms:///alias/k", {"IMGBUILD_COSIGN": str(broken)})
    assert e.value.message == ("cosign version failed: nothing was signed by this run and no "
                               "tag moved")
    assert e.value.facts == [f"{broken} version --json", "cosign exit status 4",
                             "Error: no config"]
    assert e.value.hint.startswith("check that the credentials of awskms cosign reads")


def test_sign_passes_the_ca_and_the_environment_to_every_cosign_call(tmp_path):
    """Each call, the attestations as much as the signature, reaches the registry with the CA
    it was given and runs in the environment it was given (the KMS's credentials are there)."""
    c = fake_cosign(tmp_path, VERSION_2 + "\n"
                    f'echo "$KMS_CREDENTIALS" >> {tmp_path}/env\n'
                    'for i in "$@"; do if [ "$prev" = --predicate ]; then '
                    f'basename "$(dirname "$i")" >> {tmp_path}/dirs; fi; prev=$i; done')
    cosigncli.sign(Delegated(str(c), "awskms:///alias/k"), REF, {"cyclonedx": {}},
                   plain_http=False, cacert="/etc/ca.pem",
                   env={"PATH": os.environ["PATH"], "KMS_CREDENTIALS": "from-the-job"})
    got = calls(tmp_path)
    assert [a[a.index("--registry-cacert") + 1] for a in got] == ["/etc/ca.pem"] * 2
    assert (tmp_path / "env").read_text().split() == ["from-the-job"] * 2
    # its own kind of temporary directory, told apart from others in /tmp
    assert (tmp_path / "dirs").read_text().startswith("imgbuild-attest-")
