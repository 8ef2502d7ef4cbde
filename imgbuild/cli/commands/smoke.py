from __future__ import annotations

from ...image import daemon, smoke
from ..views import image as views


def run(args, out) -> int:
    daemon.client()  # no daemon: the environment error, before anything else
    rep = smoke.run(args.image, gpu=args.gpu)
    views.smoke(out, args.image, rep)
    return 0 if rep.ok else 1
