#!/usr/bin/env python3
"""TEST ONLY: a `cosign` that imgbuild finds through IMGBUILD_COSIGN, standing in for what the
real cosign reaches over the network, then handing the call to the real cosign 2.5.

imgbuild's code has no test path: it runs `cosign sign|attest|public-key|version` exactly as
it would in CI. This shim changes only the key reference, at the boundary:
- a KMS URI (`--key hashivault://...`): the key file COSIGN_SHIM_KEY instead of the KMS;
- keyless (no `--key`): instead of an OIDC token, Fulcio and Rekor, the key COSIGN_SHIM_KEY with
  the certificate COSIGN_SHIM_CERT and its chain COSIGN_SHIM_CHAIN (tests/sigstore_standin.py's
  CA issued them) and no transparency log (`--tlog-upload=false`). Real keyless cosign asks for
  confirmation on stdin before it contacts Fulcio unless given --yes; the shim refuses the same
  way, since with --tlog-upload=false the real one would no longer ask.
Each call's argv as imgbuild gave it is appended to COSIGN_SHIM_LOG (JSON lines)."""

from __future__ import annotations

import json
import os
import sys

KMS = ("awskms://", "gcpkms://", "azurekms://", "hashivault://", "k8s://", "gitlab://", "pkcs11:")


def main(argv: list[str]) -> int:
    env = os.environ
    if env.get("COSIGN_SHIM_LOG"):
        with open(env["COSIGN_SHIM_LOG"], "a") as f:
            f.write(json.dumps(argv) + "\n")
    args = list(argv)
    if args and args[0] in ("sign", "attest", "public-key"):
        if "--key" in args:
            i = args.index("--key") + 1
            if args[i].startswith(KMS):
                args[i] = env["COSIGN_SHIM_KEY"]
        elif args[0] in ("sign", "attest"):
            if "--yes" not in args and "-y" not in args:
                sys.stderr.write("Are you sure you would like to continue? [y/N] Error: "
                                 "signing: user declined the prompt (cosign-shim: keyless "
                                 "without --yes)\n")
                return 1
            if not env.get("COSIGN_SHIM_CERT"):
                sys.stderr.write("cosign-shim: keyless asked, and the test gave no stand-in "
                                 "certificate (COSIGN_SHIM_CERT)\n")
                return 1
            args[1:1] = ["--key", env["COSIGN_SHIM_KEY"], "--certificate", env["COSIGN_SHIM_CERT"],
                         "--certificate-chain", env["COSIGN_SHIM_CHAIN"], "--tlog-upload=false"]
    real = env["COSIGN_SHIM_REAL"]
    os.execv(real, [real, *args])
    return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
