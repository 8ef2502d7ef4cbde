"""Signing through Sigstore's own client, the `cosign` binary, for what imgbuild cannot sign
itself: keyless (a Fulcio certificate for the job's OIDC identity, logged in Rekor) and keys
held in a KMS (the provider's API, which only cosign speaks). A key file or `env://VAR` is
signed in-process (image/cosign.py); both ways write the same layout under `.sig` / `.att`.

Which `--sign-key` means which signer, the command lines and how a failure reads are pure
functions here; `run` and `sign` are the only parts that start a process. Nothing secret is
ever on a command line: cosign reads the registry credentials from the Docker config
imgbuild reads (DOCKER_CONFIG or ~/.docker/config.json, credential helpers included), a KMS's
credentials from its provider's usual environment, the OIDC token from the CI job."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..errors import EnvError, InputError

KEYLESS = "keyless"
# The key references cosign's --key takes besides a file (sigstore/cosign pkg/signature/keys.go
# and the KMS providers its binary registers: sigstore/sigstore pkg/signature/kms/*).
KMS_SCHEMES = ("awskms://", "gcpkms://", "azurekms://", "hashivault://", "k8s://", "gitlab://",
               "pkcs11:")
# cosign 3 writes Sigstore bundles as OCI referrers by default; imgbuild reads (and `verify`,
# `pull` and `run` check) the `.sig` / `.att` tags cosign 2 writes.
SUPPORTED_MAJOR = 2
TIMEOUT_S = 600  # one cosign call: a KMS or Fulcio round trip, a few registry requests
TAIL = 1500  # characters of cosign's stderr an error shows
# Where cosign finds an OIDC token with no browser (sigstore/cosign pkg/providers): GitHub
# Actions with `permissions: id-token: write`, a token handed over in SIGSTORE_ID_TOKEN (GitLab
# CI's id_tokens, Buildkite's `oidc request-token`, any other CI), a token file.
TOKEN_FILE = "/var/run/sigstore/cosign/oidc-token"


@dataclass(frozen=True)
class Delegated:
    """A signer that is the cosign binary: keyless (key None) or a KMS key reference."""

    cosign: str  # the binary's path
    key: str | None  # the KMS URI; None: keyless

    @property
    def kind(self) -> str:
        return "kms" if self.key else KEYLESS

    @property
    def source(self) -> str:
        return self.key or "keyless (this job's OIDC identity, through Fulcio)"


def delegated_kind(spec: str) -> str | None:
    """Which signer a `--sign-key` value means: "keyless", "kms", or None (a key file or
    env://VAR, which imgbuild opens and signs with itself)."""
    if spec == KEYLESS:
        return KEYLESS
    if spec.startswith(KMS_SCHEMES):
        return "kms"
    return None


def registry_flags(plain_http: bool, cacert: str | None = None) -> list[str]:
    """How cosign reaches the registry as imgbuild does: plain HTTP (or a certificate this
    machine does not trust) only where imgbuild allows it (a loopback host, or one named in
    IMGBUILD_INSECURE_REGISTRIES), else TLS verified with the CA imgbuild uses for that host."""
    if plain_http:
        return ["--allow-insecure-registry", "--allow-http-registry"]
    return ["--registry-cacert", cacert] if cacert else []


def _key_flags(key: str | None) -> list[str]:
    # A KMS key is checked by its public key, as a key file signed by imgbuild is: nothing goes
    # to the public transparency log (a private image's digest included). Keyless needs the log:
    # Rekor dates the signature inside the certificate's ten minutes.
    return ["--key", key, "--tlog-upload=false"] if key else []


def sign_argv(signer: Delegated, ref: str, *, plain_http: bool,
              cacert: str | None = None) -> list[str]:
    """`cosign sign` for `ref` (REPO@DIGEST): --yes, or cosign asks on stdin before it sends
    anything to Fulcio or Rekor (and fails, stdin being closed)."""
    return [signer.cosign, "sign", "--yes", *_key_flags(signer.key),
            *registry_flags(plain_http, cacert), ref]


def attest_argv(signer: Delegated, ref: str, kind: str, predicate: str, *, plain_http: bool,
                cacert: str | None = None) -> list[str]:
    """`cosign attest` of one predicate file as `kind` (cyclonedx, slsaprovenance1)."""
    return [signer.cosign, "attest", "--yes", *_key_flags(signer.key),
            *registry_flags(plain_http, cacert), "--type", kind, "--predicate", predicate, ref]


def public_key_argv(signer: Delegated) -> list[str]:
    assert signer.key is not None
    return [signer.cosign, "public-key", "--key", signer.key]


def version_of(text: str) -> tuple[int, ...] | None:
    """The release `cosign version --json` names (gitVersion "v2.5.0"); None where it names
    none (a distribution's build says "devel")."""
    try:
        v = str(json.loads(text).get("gitVersion") or "")
    except (ValueError, AttributeError):
        v = text
    m = re.search(r"\bv?(\d+)\.(\d+)\.(\d+)", v)
    return tuple(int(x) for x in m.groups()) if m else None


def version_refusal(version: tuple[int, ...] | None) -> str | None:
    """Why this cosign cannot sign for imgbuild (None: it can). An unnamed release is taken
    for what it claims to be; the signature read back after signing catches the rest."""
    if version is not None and version[0] != SUPPORTED_MAJOR:
        return (f"cosign {'.'.join(map(str, version))} writes its signatures as Sigstore "
                f"bundles (OCI referrers), not the `.sig`/`.att` tags of cosign "
                f"{SUPPORTED_MAJOR} that imgbuild reads")
    return None


def ambient_identity(env: Mapping[str, str], token_file: bool) -> str | None:
    """Where cosign will take the OIDC token from without a browser; None: nowhere."""
    if env.get("ACTIONS_ID_TOKEN_REQUEST_URL") and env.get("ACTIONS_ID_TOKEN_REQUEST_TOKEN"):
        return "GitHub Actions' OIDC token"
    if env.get("SIGSTORE_ID_TOKEN"):
        return "SIGSTORE_ID_TOKEN"
    if token_file:
        return TOKEN_FILE
    return None


def find(env: Mapping[str, str]) -> str | None:
    """The cosign binary: IMGBUILD_COSIGN (one not on PATH, e.g. the project's setup installs
    Debian's beside the system's packages), else `cosign` on PATH."""
    named = env.get("IMGBUILD_COSIGN")
    if named:
        return named if os.access(named, os.X_OK) and Path(named).is_file() else None
    return shutil.which("cosign", path=env.get("PATH"))


def tail(text: str, n: int = TAIL) -> str:
    text = text.strip()
    return text if len(text) <= n else "..." + text[-n:]


def failed(what: str, argv: list[str], rc: int, stderr: str, signer: Delegated) -> EnvError:
    """cosign's failure, as a chain of facts: its command (nothing secret is on it), its exit
    status and the end of what it said; the way out depends on the signer."""
    hint = ("keyless signing needs the job's OIDC token (GitHub Actions: `permissions: "
            "id-token: write`) and Fulcio and Rekor reachable (sigstore.dev)"
            if signer.key is None else
            f"check that the credentials of {signer.key.split(':', 1)[0]} cosign reads from "
            "the environment may sign with that key")
    return EnvError(f"{what} failed: nothing was signed by this run and no tag moved",
                    facts=[" ".join(argv), f"cosign exit status {rc}",
                           *[ln for ln in tail(stderr).splitlines() if ln.strip()]],
                    hint=hint + "; the content tag stays pushed, and a rerun signs it")


def run(argv: list[str], what: str, signer: Delegated,
        env: Mapping[str, str] | None = None) -> str:
    """Run cosign, stdin closed (a prompt fails at once instead of waiting); its stdout."""
    try:
        r = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           timeout=TIMEOUT_S, env=dict(os.environ if env is None else env))
    except subprocess.TimeoutExpired as e:
        raise failed(what, argv, -1, f"{e.stderr or ''}\n(no answer in {TIMEOUT_S} s)",
                     signer) from None
    except OSError as e:
        raise failed(what, argv, -1, f"{type(e).__name__}: {e.strerror or e}", signer) from None
    if r.returncode != 0:
        raise failed(what, argv, r.returncode, r.stderr, signer)
    return r.stdout


def preflight(spec: str, env: Mapping[str, str] | None = None) -> Delegated:
    """Before anything is built: the cosign binary a keyless or KMS `--sign-key` needs, a
    release that writes what imgbuild reads, and for keyless an OIDC token it can take without
    a browser. A missing one is an environment problem (exit 3)."""
    env = os.environ if env is None else env
    kind = delegated_kind(spec)
    assert kind is not None
    path = find(env)
    if path is None:
        named = env.get("IMGBUILD_COSIGN")
        raise EnvError(f"--sign-key {spec} signs through the cosign binary, and there is none",
                       facts=[f"IMGBUILD_COSIGN={named} is not an executable file" if named
                              else "no `cosign` on PATH",
                              "a keyless or KMS signature is made by Sigstore's own client; "
                              "imgbuild signs only with a key file or env://VAR itself"],
                       hint="install cosign 2.x (GitHub Actions: sigstore/cosign-installer with "
                            "cosign-release v2.5.0; Debian trixie: the cosign package) or name "
                            "it in IMGBUILD_COSIGN")
    signer = Delegated(path, None if kind == KEYLESS else spec)
    out = run([path, "version", "--json"], "cosign version", signer, env)
    bad = version_refusal(version_of(out))
    if bad:
        raise EnvError(f"{path} cannot sign for imgbuild", facts=[bad],
                       hint="install cosign 2.x (sigstore/cosign-installer: cosign-release "
                            "v2.5.0), or name one in IMGBUILD_COSIGN")
    if kind == KEYLESS and ambient_identity(env, Path(TOKEN_FILE).is_file()) is None:
        raise EnvError("--sign-key keyless: this job has no OIDC identity cosign can take "
                       "without a browser",
                       facts=["no ACTIONS_ID_TOKEN_REQUEST_URL/TOKEN (GitHub Actions), no "
                              f"SIGSTORE_ID_TOKEN, no {TOKEN_FILE}"],
                       hint="in GitHub Actions give the job `permissions: id-token: write`; "
                            "elsewhere put the CI's OIDC token (audience sigstore) in "
                            "SIGSTORE_ID_TOKEN, or sign with a key (--sign-key cosign.key)")
    return signer


def public_key_pem(signer: Delegated, env: Mapping[str, str] | None = None) -> bytes:
    """The public half of a KMS key, as cosign reads it from the provider."""
    return run(public_key_argv(signer), "cosign public-key", signer, env).encode()


def sign(signer: Delegated, ref: str, predicates: Mapping[str, dict], *, plain_http: bool,
         cacert: str | None = None, env: Mapping[str, str] | None = None) -> None:
    """Sign `ref` (REPO@DIGEST) and attest each predicate ({cosign --type: predicate}) with
    cosign. The predicate files go to a directory only this user can read, removed after."""
    if not isinstance(ref, str) or "@sha256:" not in ref:
        raise InputError(f"cosign signs an image by digest, not {ref}")
    run(sign_argv(signer, ref, plain_http=plain_http, cacert=cacert), "cosign sign", signer,
        env)
    with tempfile.TemporaryDirectory(prefix="imgbuild-attest-") as d:  # mode 0700
        for kind, predicate in predicates.items():
            path = Path(d) / f"{kind}.json"
            path.write_text(json.dumps(predicate))
            run(attest_argv(signer, ref, kind, str(path), plain_http=plain_http, cacert=cacert),
                f"cosign attest --type {kind}", signer, env)
