from __future__ import annotations

from ...errors import InputError
from ...image import registry
from ...pipeline.index import assemble
from ...plan.index import make_index_plan
from ..args import repository, workspace
from ..views import image as views


def run(args, out) -> int:
    ws = workspace(args)
    multi = sorted(n for n, t in ws.catalog.targets.items() if t.multi_platform)
    names = multi if args.all else args.targets
    if not names:
        raise InputError("name the targets whose index to assemble, or --all",
                         facts=[f"multi-platform targets: {', '.join(multi) or 'none'}"])
    for n in names:
        if not ws.catalog.target(n).multi_platform:
            raise InputError(f"target '{n}' names one platform: its image is its own tag",
                             hint="an index is assembled for targets with several `platforms:`")
    repo = registry.repository(repository(args), True)
    registry.check_reachable(repo)
    # CI assembles what the repository pins: nothing is resolved here.
    done = [assemble(make_index_plan(ws, n, model=args.model, repository=repo.name,
                                     resolve=False), repo) for n in names]
    views.indexes(out, done)
    return 0
