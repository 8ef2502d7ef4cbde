from __future__ import annotations

from ...errors import InputError
from ...image import attest
from ...image.registry import Repository
from ..args import workspace
from ..views import image as views


def run(args, out) -> int:
    name, _, tag = args.ref.rpartition(":")
    if not name or "/" in tag:
        raise InputError(f"{args.ref}: expected HOST[:PORT]/REPO:TAG",
                         hint="e.g. 127.0.0.1:5000/imgbuild:tiny-cpu")
    repo = Repository.parse(name)
    if repo.host is None:
        raise InputError(f"{args.ref} names no registry host", hint="verify checks a registry's copy")
    first = attest.verify(repo, tag)
    # The lock the image names, where this workspace has that target: compare it too.
    target = first.labels.get("io.imgbuild.target")
    ws = workspace(args)
    if target and target in ws.catalog.targets and ws.target(target).has_lock:
        first = attest.verify(repo, tag, lock=ws.target(target).lock())
    views.verification(out, first)
    return 0 if first.ok else 1
