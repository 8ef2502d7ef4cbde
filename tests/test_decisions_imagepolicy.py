"""The admission policies `imgbuild run --emit k8s` writes beside a Deployment, as reviewed,
and the decisions that shape them, without an Engine or a cluster.

tests/test_imagepolicy.py validates the documents against each controller's published schema
and its webhook's own checks. This file pins what a schema cannot see: the names a cluster
lists (the policy's, the authority's, the rule's), the comments an operator reads at the top
of each file, and the trust root as a TrustRoot, to their reviewed copies in
tests/golden/admission/ (`make golden` records them after a change meant to change them). The
decisions beside them (which images a pattern takes, which log keys are current, what a
webhook would refuse) each get a case that fails when the decision is wrong.

The trust roots here are short stand-in texts: the documents carry them as given (base64 for
policy-controller, PEM for Kyverno), so the pages stay readable.
"""

from __future__ import annotations

import hashlib

import pytest

from imgbuild.catalog.registries import SignPolicy
from imgbuild.errors import InputError
from imgbuild.plan import imagepolicy as ip
from imgbuild.plan.imagepolicy import InlineTrust, TrustData, TrustedCA, TrustedLog
from imgbuild.plan.manifests import dump

from . import golden

REPO = "registry.acme.example/serving"
KEY = SignPolicy("images/registries.yaml", key="keys/ci.pub")
PEM = "-----BEGIN PUBLIC KEY-----\nKEY\n-----END PUBLIC KEY-----\n"
WHO = {"issuer": "https://token.actions.githubusercontent.com",
       "subject": "https://github.com/acme/serving/.github/workflows/ci.yaml@refs/heads/main"}


def keyless(**kw) -> SignPolicy:
    return SignPolicy("images/registries.yaml", **WHO, **kw)


def log(url: str, *, end: str | None = None, ecdsa: bool = True,
        hash_algorithm: str = "SHA2_256") -> TrustedLog:
    return TrustedLog(url, hash_algorithm, f"PEM-OF-{url}\n", ecdsa=ecdsa, end=end)


CA1 = TrustedCA("sigstore.dev", "sigstore", "https://fulcio.sigstore.dev",
                ("INTERMEDIATE-1\n", "ROOT\n"))
CA2 = TrustedCA("sigstore.dev", "sigstore", "https://fulcio.sigstore.dev",
                ("INTERMEDIATE-2\n", "ROOT\n"))
# Two CAs sharing a root; a current Rekor, two ended ones and one policy-controller cannot
# use;
# a current CT log, an ended one and one whose hash it knows by another name.
TRUST = TrustData(
    "trusted_root.json", (CA1, CA2),
    (log("https://rekor.sigstore.dev"), log("https://rekor.old", end="2024-01-01T00:00:00Z"),
     log("https://log2025.rekor", ecdsa=False),
     # a name of many hyphens, which the header's lines do not break at
     log("https://rekor-of-the-acme-build-farm-in-the-north-east.example", end="2025-01-01")),
    (log("https://ctfe.sigstore.dev/2022"), log("https://ctfe.sigstore.dev/test",
                                                end="2022-10-31T00:00:00Z"),
     log("https://ctfe.384", hash_algorithm="SHA2_384", ecdsa=False)))


def page(header: str, doc: dict) -> str:
    """As `run --emit k8s` writes a policy: its header, then the document (one YAML style)."""
    return header + dump(doc)


GOLDEN = golden.page_folder(__name__)


def pages() -> dict[str, str]:
    """Each written file, as its case's name: the header an operator reads, then the document."""
    name = ip.policy_name(REPO)
    rooted = keyless(trust_root="trusted_root.json")
    inline = ip.inline_of(TRUST)
    cases = {
        "policy-controller-key": ("policy-controller", KEY, PEM, None),
        "policy-controller-keyless-public": ("policy-controller", keyless(attestations=()),
                                             None, None),
        "policy-controller-keyless-trust-root": ("policy-controller", rooted, None, None),
        "policy-controller-keyless-no-tlog-no-sct": (
            "policy-controller", keyless(trust_root="trusted_root.json", tlog=False, sct=False),
            None, None),
        "kyverno-key": ("kyverno", KEY, PEM, None),
        "kyverno-keyless-public": ("kyverno", keyless(attestations=("cyclonedx",)), None, None),
        "kyverno-keyless-trust-root": ("kyverno", rooted, None, inline),
        "kyverno-keyless-no-tlog": ("kyverno", keyless(trust_root="trusted_root.json",
                                                       tlog=False), None, inline),
    }
    out = {f"{case}.yaml": page(ip.admission_header(admission, policy),
                                ip.admission_policy(admission, REPO, policy, pem, trust))
           for case, (admission, policy, pem, trust) in cases.items()}
    out["trustroot.yaml"] = page(ip.trust_root_header(rooted, name, TRUST),
                                 ip.trust_root_resource(name, TRUST))
    plain = TrustData("plain.json", (CA1,), (TRUST.tlogs[0],), (TRUST.ctlogs[0],))
    out["trustroot-nothing-left-out.yaml"] = page(ip.trust_root_header(rooted, name, plain),
                                                  ip.trust_root_resource(name, plain))
    notes = {"tlog": ip.trust_root_note(rooted, name),
             "no tlog": ip.trust_root_note(keyless(trust_root="t.json", tlog=False), name)}
    out["trust-root-notes.txt"] = "".join(f"{k}: {v}\n" for k, v in notes.items())
    return out




def test_the_admission_files_are_the_reviewed_ones():
    GOLDEN.check(pages())


# --- which images a policy takes -----------------------------------------------------------

@pytest.mark.parametrize("match", ["ghcr.io/acme/serving", "ghcr.io/acme/serving/",
                                   "ghcr.io/acme/serving//"])
def test_a_trailing_slash_does_not_change_what_is_matched(match):
    assert ip.globs(match) == ["ghcr.io/acme/serving:*", "ghcr.io/acme/serving@*",
                               "ghcr.io/acme/serving/**"]
    assert ip.image_references(match) == ["ghcr.io/acme/serving:*", "ghcr.io/acme/serving@*",
                                          "ghcr.io/acme/serving/*"]


def test_a_leading_slash_is_kept_where_the_user_wrote_it():
    # rstrip, not strip: a pattern is matched from its first character.
    assert ip.globs("/acme/") == ["/acme:*", "/acme@*", "/acme/**"]


def test_only_slashes_are_taken_off_the_end():
    assert ip.globs("registry.example/ACME-X")[0] == "registry.example/ACME-X:*"
    assert ip.image_references("registry.example/ACME-X")[0] == "registry.example/ACME-X:*"


@pytest.mark.parametrize("repository, kyverno", [
    ("acme/serving", "docker.io/acme/serving"),  # Docker Hub shorthand
    ("serving", "docker.io/serving"),
    # the registry is the first component only: a dot further in names no registry
    ("acme/team.x/serving", "docker.io/acme/team.x/serving"),
    ("localhost/acme", "localhost/acme"),
    ("localhost:5000/acme", "localhost:5000/acme"),
    ("ghcr.io/acme/serving", "ghcr.io/acme/serving"),
    ("Acme/serving", "Acme/serving"),  # an upper-case first component is a registry host
])
def test_kyverno_puts_its_default_registry_only_before_a_name_without_one(repository, kyverno):
    assert ip.kyverno_name(repository) == kyverno


# --- the names a cluster lists -------------------------------------------------------------

def _h(match: str) -> str:
    return hashlib.sha256(match.encode()).hexdigest()[:8]


@pytest.mark.parametrize("match, slug", [
    ("ghcr.io/acme/serving", "ghcr-io-acme-serving"),
    ("/acme/x/", "acme-x"),  # no dash at either end of the slug
    ("a" * 39 + "/b", "a" * 39),  # cut at 40, then no dash left at the cut
    ("a" * 45, "a" * 40),
    ("/" + "a" * 45, "a" * 40),  # the dash goes before the cut, not after it
])
def test_a_policy_name_is_a_dns_label_told_apart_by_its_hash(match, slug):
    assert ip.policy_name(match) == f"imgbuild-{slug}-{_h(match)}"


# --- the trust root ------------------------------------------------------------------------

def test_kyverno_takes_every_ca_certificate_once_and_the_current_log_keys():
    got = ip.inline_of(TRUST)
    assert got.roots == "INTERMEDIATE-1\nROOT\nINTERMEDIATE-2\n"
    assert got.rekor == (("https://rekor.sigstore.dev", "PEM-OF-https://rekor.sigstore.dev\n"),
                         ("https://log2025.rekor", "PEM-OF-https://log2025.rekor\n"))
    assert got.ctlog == ("PEM-OF-https://ctfe.sigstore.dev/2022\n", "PEM-OF-https://ctfe.384\n")


def test_two_alternatives_need_only_one_of_them():
    two = InlineTrust(roots="R", rekor=(("https://a", "A"), ("https://b", "B")), ctlog=("C",))
    doc = ip.kyverno_cluster_policy(REPO, keyless(trust_root="t.json"), None, two)
    [attestor] = doc["spec"]["rules"][0]["verifyImages"][0]["attestors"]
    assert attestor["count"] == 1 and len(attestor["entries"]) == 2
    one = InlineTrust(roots="R", rekor=(("https://a", "A"),), ctlog=("C",))
    doc = ip.kyverno_cluster_policy(REPO, keyless(trust_root="t.json"), None, one)
    assert "count" not in doc["spec"]["rules"][0]["verifyImages"][0]["attestors"][0]


def test_the_trustroot_keeps_a_ct_log_key_it_would_refuse_for_rekor():
    """Only a Rekor key must be ECDSA: an Ed25519 CT log key is kept, and a hash name
    policy-controller spells otherwise is translated, an unknown one taken as SHA-256."""
    trust = TrustData("t.json", (CA1,), (),
                      (log("https://ct.ed25519", ecdsa=False, hash_algorithm="SHA2_384"),
                       log("https://ct.unknown", hash_algorithm="SHA3_256")))
    keys = ip.trust_root_resource("n", trust)["spec"]["sigstoreKeys"]
    assert [(t["baseURL"], t["hashAlgorithm"]) for t in keys["ctLogs"]] == [
        ("https://ct.ed25519", "sha-384"), ("https://ct.unknown", "sha-256")]
    assert "tLogs" not in keys


@pytest.mark.parametrize("trust, fact", [
    (TrustData("t.json", (TrustedCA("o", "", "u", ("C\n",)),), (), ()),
     "certificateAuthorities[0] has no subject.commonName"),
    (TrustData("t.json", (CA1, TrustedCA("", "c", "u", ("C\n",))), (), ()),
     "certificateAuthorities[1] has no subject.organization"),
    (TrustData("t.json", (CA1,), (log("https://a"), log("")), ()), "tlogs[1] has no baseUrl"),
    (TrustData("t.json", (CA1,), (), (log(""),)), "ctlogs[0] has no baseUrl"),
])
def test_a_field_the_trustroot_webhook_requires_is_named_when_missing(trust, fact):
    with pytest.raises(InputError) as e:
        ip.trust_root_resource("n", trust)
    assert e.value.message == ("the trust root t.json cannot be written as a policy-controller "
                               "TrustRoot")
    assert e.value.facts == [fact, "policy-controller refuses a TrustRoot without them"]
    assert e.value.hint == (
        "give each CA of the trust root file its subject and uri and each log its baseUrl "
        "(Sigstore's public trust root has them), or pass --admission kyverno, whose policy "
        "carries the trust root without them")


@pytest.mark.parametrize("policy", [keyless(), KEY,
                                    SignPolicy("r.yaml", key="k.pub", trust_root="t.json")])
def test_only_a_keyless_policy_with_a_trust_root_refers_to_a_trustroot(policy):
    assert ip.trust_root_note(policy, "n") is None
