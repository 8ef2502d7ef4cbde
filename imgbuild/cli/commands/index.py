from __future__ import annotations

from ...errors import InputError
from ...image import attest, registry
from ...pipeline.build import signing_key
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
    # The key is opened, and checked against the registry's policy, before the registry is
    # asked anything: a wrong password is exit 2 with nothing written.
    policy = ws.registries.policy_for(repo.name)
    signer = signing_key(args.sign_key, push=True, policy=policy)
    registry.check_reachable(repo)
    commit = attest.git_commit(ws.images) if signer is not None else None
    # CI assembles what the repository pins: nothing is resolved here.
    done = [assemble(make_index_plan(ws, n, model=args.model, repository=repo.name,
                                     resolve=False), repo, signer=signer, policy=policy,
                     commit=commit, progress=out.progress()) for n in names]
    views.indexes(out, done)
    return 0
