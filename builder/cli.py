"""Command line: parse arguments, call the stages, print. No decisions live here."""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from pathlib import Path

from . import ui
from .errors import EXIT_FAILED, EXIT_OK, ImgbuildError, InputError

COMMANDS = ("list", "plan", "lock", "check-deps", "build", "pull", "smoke", "preflight", "doctor",
            "check-model", "patches", "matrix", "outdated", "relock", "base")


def _paths(args) -> tuple[Path | None, Path, Path | None]:
    from .spec import images_dir

    images = Path(args.images) if args.images else None
    root = images or images_dir()
    lock_dir = Path(args.lockfiles) if args.lockfiles else root.parent / "lockfiles"
    wheels = args.wheels or os.environ.get("IMGBUILD_WHEELS")
    if wheels and not Path(wheels).is_dir():
        raise InputError(f"--wheels {wheels}: no such directory",
                         hint="point it at a directory of .whl files, or leave it out")
    return images, lock_dir, Path(wheels) if wheels else None


def _archs(args, cat) -> tuple[str, ...] | None:
    """--arch B200 --arch 'RTX PRO 6000' or --arch sm100,12.0 -> ("sm100", "sm120")."""
    from .archs import parse_arch

    given = [a for v in (getattr(args, "arch", None) or []) for a in v.split(",") if a.strip()]
    return tuple(parse_arch(a, cat) for a in given) or None


def _catalog(args):
    from .spec import load_catalog

    images, _, _ = _paths(args)
    return load_catalog(images)


def cmd_list(args) -> int:
    cat = _catalog(args)
    if args.json:
        ui.print_json({
            "targets": {n: {"engine": f"{t.engine}=={t.engine_version}", "archs": list(t.archs),
                            "os": t.os, "flavor": t.flavor, "description": t.description}
                        for n, t in cat.targets.items()},
            "models": {a: {"name": m.name, "checkpoint": m.checkpoint, "size_gb": m.size_gb,
                           "tensor_parallel": m.tensor_parallel}
                       for a, m in cat.models.items()}})
        return EXIT_OK
    ui.table("targets", ["target", "engine", "archs", "os", "flavor"],
             [[n, f"{t.engine} {t.engine_version}", " ".join(t.archs), t.os, t.flavor]
              for n, t in cat.targets.items()])
    ui.table("model profiles", ["model", "name", "checkpoint", "size", "TP", "quantization"],
             [[a, m.name, m.checkpoint, f"{m.size_gb:g} GB", m.tensor_parallel,
               m.quant_summary] for a, m in cat.models.items()])
    return EXIT_OK


def cmd_plan(args) -> int:
    from .plan import make_plan

    cat = _catalog(args)
    _, lock_dir, wheels = _paths(args)
    plan = make_plan(cat, args.target, model=args.model, lock_dir=lock_dir, wheels=wheels,
                     repository=args.registry or "imgbuild", archs=_archs(args, cat),
                     flavor=args.flavor)
    findings = []
    if not args.no_checks:
        from .deps import check_deps

        findings = check_deps(cat, plan.target, model=plan.model, lock_dir=lock_dir)
    rc = EXIT_FAILED if findings else EXIT_OK
    if args.json:
        ui.print_json(plan.to_dict() | {"checks": None if args.no_checks else {
            "ok": not findings, "findings": [f.to_dict() for f in findings]}})
        return rc
    rows = [
        ("target", f"{plan.target}  ({plan.description[:70]})"),
        ("engine", f"{plan.engine} {plan.engine_version}"),
        ("model", f"{plan.model}: {plan.model_name} ({plan.checkpoint}), TP {plan.tensor_parallel}"
         if plan.model else "none"),
        ("archs", ", ".join(plan.archs)),
        ("CUDA", plan.cuda or "none (CPU)"),
        ("driver", f"≥ {plan.min_driver}" if plan.min_driver else "none (CPU)"),
        ("base", f"{plan.base_image}  [{plan.flavor}, {plan.base_os}]"),
        ("why", "\n".join(plan.selection)),
        ("python", plan.python),
        ("platform", plan.platform_tag),
        ("lock", f"{plan.lock_path}  ({plan.lock_packages} packages, {plan.lock_hash[:19]}…)"),
        ("heavy layer", ", ".join(plan.heavy_packages) or "none"),
        ("overrides", "none" if not plan.overrides else
         "\n".join(f"{o.requirement}: {o.reason}" + (f" ({o.link})" if o.link else "")
                   for o in plan.overrides)),
        ("patches", ", ".join(plan.patches) or "none"),
        ("smoke model", f"{plan.smoke_model} ({(plan.smoke_model_key or '')[:12]})"
         if plan.smoke_model else "none"),
        ("content key", plan.content_key),
        ("tags", "\n".join(plan.refs)),
    ]
    rows.append(("dependency check", "skipped (--no-checks)" if args.no_checks else
                 "ok: every symbol the engines use exists in the locked versions" if not findings
                 else f"{len(findings)} finding(s): see below"))
    ui.kv(f"plan for {plan.target}", rows)
    if findings:
        from . import drift

        c = ui.console()
        for line in drift.explain(findings):
            c.out(line, highlight=False)
    return rc


def cmd_lock(args) -> int:
    from concurrent.futures import ThreadPoolExecutor

    from .errors import ResolveError
    from .lock import check_overrides, lock_many, read_lock, resolve, resolve_explained
    from .plan import lock_request

    cat = _catalog(args)
    _, lock_dir, wheels = _paths(args)
    names = list(cat.targets) if args.all else args.targets
    if not names:
        raise InputError("name a target or pass --all", hint="see `imgbuild list`")
    reqs = [lock_request(cat, cat.target(n)) for n in names]
    out: list[dict] = []
    failed: list[Exception] = []
    if args.check:
        def fresh(r):
            # Stale means the lock no longer matches its spec: resolve keeping the locked
            # versions where they still fit. Upstream releases alone are `imgbuild outdated`'s
            # news, not drift (a push must not fail because numpy released).
            path = lock_dir / r.filename()
            current = read_lock(path).body if path.exists() else None
            try:
                return resolve(r, wheels, prefer=current), None
            except ResolveError:
                try:
                    return resolve_explained(r, wheels), None
                except ImgbuildError as e:
                    return None, e

        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            results = list(pool.map(fresh, reqs))
        for n, r, (body, err) in zip(names, reqs, results):
            path = lock_dir / r.filename()
            if err:
                failed.append(err)
                out.append({"target": n, "lock": str(path), "error": err.message})
                continue
            current = read_lock(path).body if path.exists() else ""
            diff = [d for d in difflib.unified_diff(
                current.splitlines(), body.splitlines(), f"{path.name} (committed)",
                f"{path.name} (resolved now)", lineterm="", n=0)
                if d.startswith(("---", "+++")) or (d[:1] in "+-" and "==" in d)]
            out.append({"target": n, "lock": str(path), "stale": body != current, "diff": diff})
    else:
        for n, r, (lock, written, err) in zip(names, reqs, lock_many(
                reqs, lock_dir, wheels, refresh=args.refresh, jobs=args.jobs)):
            if err:
                failed.append(err)
                out.append({"target": n, "lock": str(lock_dir / r.filename()), "error": err.message})
            else:
                out.append({"target": n, "lock": str(lock.path), "written": written,
                            "packages": len(lock.packages), "hash": lock.digest})
    for n, r, o in zip(names, reqs, out):
        path = lock_dir / r.filename()
        if r.overrides and "error" not in o and path.exists():
            reasons = {ov.requirement: ov.reason for ov in cat.target(n).overrides}
            o["overrides"] = [
                {"requirement": st.requirement, "needed": st.needed, "effect": st.effect,
                 "reason": reasons.get(st.requirement, "")}
                for st in check_overrides(r, wheels, read_lock(path))]
    stale = [o["target"] for o in out if o.get("stale")]
    if args.json:
        ui.print_json({"locks": out, "stale": stale, "failed": [o["target"] for o in out if "error" in o]})
    else:
        c = ui.console()
        for o in out:
            if "error" in o:
                c.print(f"[red]failed[/]  {o['target']}  {o['error']}")
            elif args.check:
                c.print(f"{'[red]stale[/]' if o['stale'] else '[green]fresh[/]'}  {o['target']}  {o['lock']}")
                for d in o.get("diff", []):
                    c.out("    " + d, highlight=False)
            else:
                c.print(f"{'[green]wrote[/]' if o['written'] else 'up to date'}  {o['target']}  "
                        f"{o['lock']}  ({o['packages']} packages)")
            for ov in o.get("overrides", []):
                mark = "[green]needed[/]   " if ov["needed"] else "[yellow]removable[/]"
                c.print(f"    override {mark} {ov['requirement']}: {ov['effect']}")
        for e in failed:
            ui.print_error(e, False)
    if failed:
        return max(e.exit_code for e in failed)
    return EXIT_FAILED if stale else EXIT_OK


def cmd_check_deps(args) -> int:
    from . import drift
    from .deps import check_deps
    from .plan import make_plan

    cat = _catalog(args)
    _, lock_dir, wheels = _paths(args)
    plan = make_plan(cat, args.target, model=args.model, lock_dir=lock_dir, wheels=wheels)
    findings = check_deps(cat, args.target, model=plan.model, lock_dir=lock_dir)
    if args.json:
        ui.print_json({"target": plan.target, "model": plan.model, "lock": plan.lock_path,
                       "ok": not findings, "findings": [f.to_dict() for f in findings]})
        return EXIT_FAILED if findings else EXIT_OK
    if findings:
        c = ui.console()
        for line in drift.explain(findings):
            c.out(line, highlight=False)
        return EXIT_FAILED
    ui.console().print(f"[green]ok[/]: {plan.target} ({plan.lock_path}): every symbol the locked "
                       f"engines use and every format {plan.model or 'the smoke model'} declares "
                       "exists in the locked versions")
    return EXIT_OK


def cmd_build(args) -> int:
    from .pipeline import build_target

    cat = _catalog(args)
    _, lock_dir, wheels = _paths(args)
    c = ui.console()
    log = (lambda *a: None) if args.json else (lambda m: c.print(m, highlight=False))
    out = build_target(cat, args.target, model=args.model, registry_name=args.registry,
                       archs=_archs(args, cat), flavor=args.flavor,
                       push=args.push, rebuild=args.rebuild, wheels=wheels, lock_dir=lock_dir,
                       run_smoke=not args.no_smoke, console=c, log=log,
                       log_dir=Path(args.log_dir) if args.log_dir else None,
                       no_cache=args.no_cache, force=args.force)
    if args.json:
        ui.print_json(out.to_dict())
        return EXIT_OK
    rows = [("action", out.action), ("image", out.image_id[:19]),
            ("size", f"{out.size_bytes / 1e6:.0f} MB"), ("time", f"{out.seconds:.1f} s")]
    if out.build:
        rows.append(("build", f"{out.build.seconds:.1f} s, {out.build.steps} steps, "
                              f"{out.build.cached_steps} cached"))
    if out.smoke:
        rows.append(("smoke", ("passed" if out.smoke.ok else "FAILED") + "; " + ", ".join(
            f"{s['name']} {s['status']} {s.get('duration_s', 0):.1f}s" for s in out.smoke.stages)))
    rows.append(("tags", "\n".join([out.plan.ref()] + list(out.moved))))
    if out.held:
        rows.append(("not moved", f"{', '.join(out.plan.tags)}: {out.held}"))
    if out.report_ref:
        rows.append(("smoke report", out.report_ref))
    if out.pushed:
        rows.append(("pushed", "\n".join(out.pushed)))
    ui.kv(f"{out.plan.target}: {out.action}", rows)
    return EXIT_OK


def cmd_pull(args) -> int:
    from .pipeline import pull_target

    cat = _catalog(args)
    _, lock_dir, wheels = _paths(args)
    out = pull_target(cat, args.target, model=args.model, registry_name=args.registry,
                      lock_dir=lock_dir, wheels=wheels, archs=_archs(args, cat),
                      flavor=args.flavor)
    if args.json:
        ui.print_json(out.to_dict())
    else:
        rep = out.report
        smoke_row = ("no smoke report stored for this digest: moving tags not set" if rep is None
                     else ("passed" if rep.get("ok") else "FAILED (tags moved with --force)"
                           if rep.get("forced") else "FAILED") + "; " + ", ".join(
                               f"{s_['name']} {s_['status']}" for s_ in rep.get("stages", [])))
        ui.kv(f"pulled {out.plan.target}", [("image", out.ref), ("digest", out.digest),
                                            ("smoke", smoke_row),
                                            ("tags", "\n".join(out.plan.refs))])
    return EXIT_OK


def cmd_smoke(args) -> int:
    from . import dockerenv, smoke

    dockerenv.client()
    rep = smoke.run(args.image, gpu=args.gpu)
    if args.json:
        ui.print_json(rep.to_dict() | {"ok": rep.ok})
    else:
        ui.table(f"smoke {args.image}: {'passed' if rep.ok else 'FAILED'}",
                 ["stage", "status", "seconds", "reason"],
                 [[s["name"], s["status"], f"{s.get('duration_s', 0):.2f}", s.get("reason") or ""]
                  for s in rep.stages])
    return EXIT_OK if rep.ok else EXIT_FAILED


def cmd_preflight(args) -> int:
    from . import preflight

    cat = _catalog(args)
    if args.subject in cat.targets:
        from .plan import make_plan

        _, lock_dir, wheels = _paths(args)
        plan = make_plan(cat, args.subject, model=args.model, lock_dir=lock_dir, wheels=wheels,
                         archs=_archs(args, cat), flavor=args.flavor)
        report = preflight.preflight_target(preflight.facts_from_plan(plan),
                                            model_dir=args.model_dir, nvidia_smi=args.nvidia_smi)
        title = f"preflight: this host for target {plan.target}" + \
            (f" --model {plan.model}" if plan.model else "")
    else:
        if args.model:
            raise InputError("--model goes with a target; an image carries its model in its labels",
                             hint=f"`imgbuild preflight TARGET --model {args.model}`")
        report = preflight.preflight_image(args.subject, model_dir=args.model_dir,
                                           nvidia_smi=args.nvidia_smi)
        title = f"preflight: this host for {args.subject}"
    if args.json:
        ui.print_json(report.to_dict())
    else:
        preflight.render_report(report, title=title)
    return report.exit_code


def cmd_patches(args) -> int:
    from . import patches

    cat = _catalog(args)
    _, lock_dir, _ = _paths(args)
    t = cat.target(args.target)
    results = patches.check(t, cat, lock_dir) if args.check else patches.listing(t, cat, lock_dir)
    if args.json:
        ui.print_json(patches.to_dict(results, target=t.name))
    else:
        patches.render(results, ui.console(), target=t.name)
    return EXIT_FAILED if patches.failed(results) else EXIT_OK


def cmd_check_model(args) -> int:
    from .checkmodel import check_model, render

    cat = _catalog(args)
    _, lock_dir, _ = _paths(args)
    rep = check_model(args.model, args.target, cat, lock_dir, args.fix)
    if args.json:
        ui.print_json(rep.to_dict())
    else:
        render(rep, ui.console())
    return rep.exit_code


def cmd_matrix(args) -> int:
    import json

    from . import matrix

    cat = _catalog(args)
    _, lock_dir, wheels = _paths(args)
    jobs = matrix.jobs(cat, lock_dir, changed_since=args.changed_since,
                       repository=args.registry or "imgbuild")
    if args.format == "github":
        doc = matrix.github(jobs)
    elif args.format == "bake":
        doc = matrix.bake(jobs, cat, lock_dir, wheels=wheels)
        if args.contexts:
            matrix.write_contexts(jobs, cat, lock_dir, Path(args.contexts), wheels=wheels)
    else:
        doc = {"jobs": [j.to_dict() for j in jobs]}
    # Plain JSON on stdout, one line for github (it goes into $GITHUB_OUTPUT).
    sys.stdout.write(json.dumps(doc, separators=(",", ":")) + "\n" if args.format == "github"
                     else json.dumps(doc, indent=2) + "\n")
    return EXIT_OK


def cmd_outdated(args) -> int:
    from . import outdated

    cat = _catalog(args)
    _, lock_dir, wheels = _paths(args)
    news = outdated.outdated(cat, lock_dir, targets=args.targets or None, wheels=wheels)
    if args.json:
        ui.print_json(outdated.to_dict(news))
    else:
        outdated.render(news)
    return EXIT_OK  # a report, not a check: news is not a failure


def cmd_relock(args) -> int:
    from . import outdated

    cat = _catalog(args)
    _, lock_dir, wheels = _paths(args)
    res = outdated.relock(cat, args.target, args.upgrade, lock_dir, wheels=wheels)
    if args.json:
        ui.print_json(res.to_dict())
    else:
        c = ui.console()
        for line in res.diff:
            c.out(line, highlight=False)
        if res.note:
            c.print(res.note)
    return EXIT_OK


def cmd_doctor(args) -> int:
    from . import doctor

    text, label = doctor.read_log(args.log)
    diags = doctor.diagnose(text, images=Path(args.images) if args.images else None)
    if args.json:
        ui.print_json(doctor.to_dict(diags, source=label))
    else:
        doctor.render(diags, ui.console(), source=label)
    # A known failure found is the job's finding (1); nothing matched is not an error (0).
    return EXIT_FAILED if diags else EXIT_OK


def cmd_refresh_digests(args) -> int:
    from . import digests
    from .spec import load_catalog

    cat = _catalog(args)
    found = digests.refresh(cat, mirror=args.mirror)
    digests.write(cat.root / "bases.yaml", found)
    load_catalog(cat.root)  # what was written must still read
    if args.json:
        ui.print_json({"digests": found})
    else:
        ui.table("nvidia/cuda digests (images/bases.yaml)", ["image", "digest"],
                 [[k, v or "tag not found"] for k, v in found.items()])
    return EXIT_OK


def cmd_base(args) -> int:
    from . import base, dockerenv
    from .registry import Repository

    cat = _catalog(args)
    if args.base not in cat.bases:
        raise InputError(f"unknown base '{args.base}'",
                         facts=["bases: " + ", ".join(sorted(cat.bases))])
    client = dockerenv.client()
    repo = Repository.parse(args.registry) if args.registry else None
    if repo is not None and repo.host is None:
        raise InputError(f"--registry {args.registry} names no registry host",
                         hint="e.g. --registry 127.0.0.1:5000/imgbuild")
    c = ui.console()
    res = base.bootstrap(client, cat.base(args.base), registry=repo, rebuild=args.rebuild,
                         log=(lambda *a: None) if args.json else (lambda m: c.print(m)))
    doc = {"image": res.image, "image_id": res.image_id, "built": res.built,
           "seconds": round(res.seconds, 1), "size_bytes": res.size_bytes,
           "pushed": list(res.pushed)}
    if args.json:
        ui.print_json(doc)
    else:
        ui.kv(f"base {args.base}", [(k, str(v)) for k, v in doc.items()])
    return EXIT_OK


def parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="machine-readable output")
    common.add_argument("--images", help="the images/ directory (default: the checkout's)",
                        default=os.environ.get("IMGBUILD_IMAGES"))
    common.add_argument("--lockfiles", help="where locks live (default: lockfiles/ beside images/)",
                        default=os.environ.get("IMGBUILD_LOCKFILES"))
    common.add_argument("--wheels", help="a local wheel directory that stands in for extra "
                        "indexes (env IMGBUILD_WHEELS)")
    select = argparse.ArgumentParser(add_help=False)
    select.add_argument("--arch", action="append", metavar="ARCH",
                        help="GPU archs instead of the target's: sm100, 10.0, B200, 'RTX PRO 6000' "
                             "(repeat or comma-separate)")
    select.add_argument("--flavor", choices=("devel", "slim"),
                        help="devel: nvidia/cuda cudnn-devel base; slim: plain OS base, CUDA "
                             "from the torch wheels")
    p = argparse.ArgumentParser(
        prog="imgbuild", description="Build, smoke-test and publish LLM serving images. "
        "`imgbuild TARGET ...` is `imgbuild build TARGET ...`.")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("list", parents=[common], help="targets and model profiles")
    s.set_defaults(func=cmd_list)
    s = sub.add_parser("plan", parents=[common, select], help="the Plan for a target (locks if needed)")
    s.add_argument("target")
    s.add_argument("--model")
    s.add_argument("--registry", help="repository the tags are for, e.g. 127.0.0.1:5000/imgbuild")
    s.add_argument("--no-checks", action="store_true",
                   help="skip the dependency (API drift) check, which reads locked wheels")
    s.set_defaults(func=cmd_plan)
    s = sub.add_parser("lock", parents=[common], help="resolve and write lockfiles")
    s.add_argument("targets", nargs="*")
    s.add_argument("--all", action="store_true")
    s.add_argument("--check", action="store_true", help="exit 1 with the diff if a lock is stale")
    s.add_argument("--refresh", action="store_true", help="re-resolve even if inputs match")
    s.add_argument("--jobs", type=int, default=4, help="locks resolved at once (default 4)")
    s.set_defaults(func=cmd_lock)
    s = sub.add_parser("check-deps", parents=[common],
                       help="API drift: what the locked engine uses exists in its locked deps")
    s.add_argument("target")
    s.add_argument("--model")
    s.set_defaults(func=cmd_check_deps)
    s = sub.add_parser("build", parents=[common, select], help="plan, lock, build, smoke, tag (and push)")
    s.add_argument("target")
    s.add_argument("--model")
    s.add_argument("--registry")
    s.add_argument("--push", action="store_true")
    s.add_argument("--rebuild", action="store_true", help="build even if the content tag exists")
    s.add_argument("--no-smoke", action="store_true",
                   help="skip the smoke test (then only the content tag is set)")
    s.add_argument("--force", action="store_true",
                   help="move the moving tags even if the smoke test fails (loud; labelled "
                        "io.imgbuild.smoke-gate=forced, so it has a content tag of its own)")
    s.add_argument("--no-cache", action="store_true",
                   help="run every build step again (BuildKit's layer cache unused; uv's kept)")
    s.add_argument("--log-dir", help="keep the full build log here")
    s.set_defaults(func=cmd_build)
    s = sub.add_parser("pull", parents=[common, select], help="pull the prebuilt image for a target")
    s.add_argument("target")
    s.add_argument("--model")
    s.add_argument("--registry", required=True)
    s.set_defaults(func=cmd_pull)
    s = sub.add_parser("smoke", parents=[common], help="run the smoke payload inside an image")
    s.add_argument("image")
    s.add_argument("--gpu", choices=("auto", "off", "require"), default="auto",
                   help="stage 4, the image's engine on a GPU: auto where there is one, "
                        "require turns a GPU skip into a failure")
    s.set_defaults(func=cmd_smoke)
    s = sub.add_parser("preflight", parents=[common, select],
                       help="check this host (GPUs, driver, memory, disk) for an image or target")
    s.add_argument("subject", metavar="IMAGE|TARGET")
    s.add_argument("--model", help="with a TARGET: the model profile to check for")
    s.add_argument("--model-dir", help="where the model will be stored (free disk is checked "
                   "there; default IMGBUILD_MODEL_DIR, else the Hugging Face cache)")
    s.add_argument("--nvidia-smi", help="the nvidia-smi binary to run")
    s.set_defaults(func=cmd_preflight)
    s = sub.add_parser("patches", parents=[common],
                       help="a target's compatibility patches; --check applies them to the "
                            "locked wheel in a scratch directory")
    s.add_argument("target")
    s.add_argument("--check", action="store_true")
    s.set_defaults(func=cmd_patches)
    s = sub.add_parser("check-model", parents=[common],
                       help="lint a checkpoint's config.json against a target's locked engine")
    s.add_argument("model", metavar="PATH|ALIAS")
    s.add_argument("--target", required=True)
    s.add_argument("--fix", metavar="OUT", help="write a corrected config.json (original kept "
                   "beside it) whose ignore list ignores exactly the same modules")
    s.set_defaults(func=cmd_check_model)
    s = sub.add_parser("matrix", parents=[common], help="CI jobs from images/: github, bake, json")
    s.add_argument("--format", choices=("github", "bake", "json"), default="json")
    s.add_argument("--changed-since", metavar="REF",
                   help="only jobs whose content key changed since this git ref")
    s.add_argument("--registry", help="repository the tags are for")
    s.add_argument("--contexts", metavar="DIR", help="with bake: write each job's build context")
    s.set_defaults(func=cmd_matrix)
    s = sub.add_parser("outdated", parents=[common],
                       help="newer upstream releases per target: available, blocked by, held")
    s.add_argument("targets", nargs="*")
    s.set_defaults(func=cmd_outdated)
    s = sub.add_parser("relock", parents=[common], help="re-resolve a target upgrading packages")
    s.add_argument("target")
    s.add_argument("--upgrade", action="append", required=True, metavar="PKG[==VER]")
    s.set_defaults(func=cmd_relock)
    s = sub.add_parser("doctor", parents=[common],
                       help="match a server log or traceback against known failures")
    s.add_argument("log", metavar="LOGFILE|-")
    s.set_defaults(func=cmd_doctor)
    s = sub.add_parser("base", parents=[common], help="base images")
    bsub = s.add_subparsers(dest="base_command", required=True)
    b = bsub.add_parser("bootstrap", parents=[common],
                        help="debootstrap + docker import a Debian base, tag and push it")
    b.add_argument("--base", default="debian-bookworm")
    b.add_argument("--registry")
    b.add_argument("--rebuild", action="store_true")
    b.set_defaults(func=cmd_base)
    b = bsub.add_parser("refresh-digests", parents=[common],
                        help="pin the catalog's nvidia/cuda tags by digest (needs the registry)")
    b.add_argument("--mirror", help="a registry that mirrors nvidia/cuda, e.g. 127.0.0.1:5000/hub")
    b.set_defaults(func=cmd_refresh_digests)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and not argv[0].startswith("-") and argv[0] not in COMMANDS:
        argv.insert(0, "build")
    args = parser().parse_args(argv)
    try:
        return args.func(args)
    except ImgbuildError as e:
        ui.print_error(e, getattr(args, "json", False))
        return e.exit_code
    except KeyboardInterrupt:
        ui.console().print("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
