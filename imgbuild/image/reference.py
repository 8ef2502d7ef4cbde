"""Repository names as Docker takes them, checked without the Docker SDK (so planning, which
names a repository, loads none of it)."""

from __future__ import annotations

import re

from ..errors import InputError

# A repository name as Docker takes it: [HOST[:PORT]/]PATH, lowercase path components.
_HOST = re.compile(r"^(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9-]+)*"
                   r"|\[[0-9a-fA-F:]+\])(?::[0-9]+)?$")
_PATH = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)"
                   r"[a-z0-9]+)*)*$")


def parse_name(name: str) -> tuple[str | None, str]:
    """`HOST[:PORT]/PATH` -> (host, path); no host: a local repository name. A name Docker
    would refuse is exit 2 with the reason."""
    why = None
    host, path = None, name
    if not name or name != name.strip() or any(c.isspace() for c in name):
        why = "it has spaces or is empty"
    elif "://" in name:
        why = ("it has a scheme: give HOST[:PORT]/REPO (plain HTTP is for loopback and "
               "--insecure-registry hosts)")
    else:
        first, _, rest = name.partition("/")
        if rest and ("." in first or ":" in first or first == "localhost"):
            host, path = first, rest
        if host is not None and not _HOST.match(host):
            why = f"'{host}' is not a registry host[:port]"
        elif not _PATH.match(path):
            why = (f"'{path}' is not a repository path (lowercase letters, digits and "
                   "separators . _ - /, no empty part)")
    if why is not None:
        raise InputError(f"--registry {name!r} is not a registry repository: {why}",
                         hint="e.g. --registry 127.0.0.1:5000/imgbuild or "
                              "--registry ghcr.io/acme/imgbuild")
    return host, path
