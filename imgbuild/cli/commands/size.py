from __future__ import annotations

from ...image import daemon, sizes
from ..views import image as views


def run(args, out) -> int:
    daemon.client()  # no daemon: the environment error, before anything else
    views.size(out, sizes.measure(args.image), top=args.top)
    return 0
