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


_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")


def parse_cache_ref(ref: str) -> tuple[str, str, str]:
    """`HOST[:PORT]/PATH:TAG` -> (host, path, tag): an image in a registry whose layers a build
    may reuse (--cache-from). Anything else is exit 2 with the reason."""
    name, sep, tag = ref.rpartition(":")
    why = None
    if not sep or "/" in tag:
        why = "it names no tag"
    elif not _TAG.match(tag):
        why = f"'{tag}' is not a tag"
    if why is None:
        try:
            host, path = parse_name(name)
        except InputError as e:
            why = e.message.split(": ", 1)[1]
        else:
            if host is None:
                why = "it names no registry host"
    if why is not None:
        raise InputError(f"--cache-from {ref!r} is not an image in a registry: {why}",
                         hint="give HOST[:PORT]/REPO:TAG, e.g. "
                              "--cache-from ghcr.io/acme/imgbuild:tiny-cpu")
    return host, path, tag
