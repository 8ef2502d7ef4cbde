"""arm64 (Grace Blackwell, DGX Spark) and multi-platform images: targets for aarch64 locked for
aarch64 wheels, planned on an arm64 base made here, their GPU code read from the aarch64 wheels
(which differ from the x86_64 ones); a target that names several platforms, locked once per
platform, built per platform (arm64 here under QEMU) and published as one OCI image index that
`pull` reads from either platform's side; and a clear answer where this machine cannot."""

from __future__ import annotations

import json

import pytest

from imgbuild.errors import EnvError
from imgbuild.payload import preflight as pf
from imgbuild.payload.preflight import PASS
from imgbuild.plan.decide import make_plan
from imgbuild.plan.labels import facts_from_plan

from .conftest import ROOT, run_imgbuild

FIXTURES = ROOT / "tests" / "fixtures" / "nvidia-smi"
ARM64 = ("sglang-gb200-k2_6", "sglang-dgx-spark", "tiny-cpu-multi-arm64")  # CI job names
GPU_ARM64 = ("sglang-gb200", "sglang-dgx-spark")


def test_a_bootstrapped_base_is_made_per_cpu(ws):
    amd64 = ws.catalog.base("debian-bookworm")
    arm64 = ws.catalog.base("debian-bookworm", "aarch64")
    assert (amd64.platform, arm64.platform) == ("linux/amd64", "linux/arm64")
    assert arm64.image == amd64.image + "-aarch64"
    recorded = ws.catalog.bases["debian-bookworm"].bootstrap
    assert arm64.bootstrap["rootfs"] == recorded["rootfs_aarch64"] != recorded["rootfs"]
    assert amd64.bootstrap["rootfs"] == recorded["rootfs"]
    # A pulled base is one multi-platform name: the same tag for every CPU.
    assert ws.catalog.base("ubuntu24.04", "aarch64").image == "ubuntu:24.04"


@pytest.mark.parametrize("name", GPU_ARM64)
def test_arm64_targets_are_locked_and_planned_for_aarch64(ws, name):
    ref = ws.target(name)
    assert ref.lock_path.name == f"{name}.py3.11-manylinux_2_36-aarch64.txt"
    assert ref.request.uv_platform == "aarch64-manylinux_2_36"
    p = make_plan(ws, name, resolve=False)
    arm64 = ws.catalog.base("debian-bookworm", "aarch64")
    assert p.cpu_arch == "aarch64" and p.platform_tag == "manylinux_2_36_aarch64"
    assert p.base_image == arm64.image and p.base_digest == arm64.bootstrap["rootfs"]
    assert p.cuda == "13.0" and p.nvcc.startswith("13.0.")
    for arch, rows in p.kernel_coverage:
        rows = dict(rows)
        assert rows["torch"] == rows["sglang-kernel"] == "sass", arch
    # The wheels read are the aarch64 ones.
    record = json.loads(ref.lock_path.with_name(ref.lock_path.stem + ".kernels.json").read_text())
    assert record["packages"]["torch"]["wheel"].endswith("_aarch64.whl")


def test_coverage_is_read_per_platform():
    # sglang-kernel 0.4.10: x86_64 common_ops carries sm_120a, nothing for sm121; the aarch64
    # wheel carries sm_121a. DGX Spark is arm64: its target plans, the x86_64 one is refused.
    r = run_imgbuild("plan", "sglang-blackwell", "--arch", "sm121", "--no-checks")
    assert r.returncode == 2 and "carries no GPU code for sm121" in " ".join(r.stderr.split())
    r = run_imgbuild("plan", "sglang-dgx-spark", "--json", "--no-checks")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["kernel_coverage"]["sm121"]["sglang-kernel"] == "sass"
    # The aarch64 wheel has no FlashAttention 3 at all: GH200 (sm90, arm64) is refused.
    r = run_imgbuild("plan", "sglang-gb200", "--arch", "sm90", "--model", "k2.6", "--no-checks")
    said = " ".join(r.stderr.split())
    assert r.returncode == 2, said
    assert "sglang-kernel 0.4.10 has no sgl_kernel/flash_ops*.so in its wheel for this " \
           "platform, needed on sm90" in said
    assert "manylinux2014_aarch64.whl has:" in said and "Traceback" not in said


def test_a_grace_gpu_named_for_an_x86_64_image_is_refused():
    r = run_imgbuild("plan", "sglang-blackwell", "--arch", "DGX Spark", "--no-checks")
    said = " ".join(r.stderr.split())
    assert r.returncode == 2, said
    assert "DGX Spark sits in aarch64 hosts, and sglang-blackwell has no linux/arm64 image" in said
    assert "use sglang-dgx-spark" in said and "--arch sm121" in said
    r = run_imgbuild("plan", "sglang-gb200", "--arch", "GB300", "--json", "--no-checks")
    assert r.returncode == 0 and json.loads(r.stdout)["archs"] == ["sm103"]


def test_dgx_spark_image_passes_the_gb10_preflight(ws):
    facts = facts_from_plan(make_plan(ws, "sglang-dgx-spark", resolve=False))
    r = pf.run(facts, runner=pf.recording_runner(FIXTURES / "gb10-1x-sm121"))
    arch = {v.check: v for v in r.verdicts}["arch"]
    assert arch.status == PASS and "sm121" in arch.detail


def _verdicts(plan, host: str) -> dict:
    r = pf.run(facts_from_plan(plan), runner=pf.recording_runner(FIXTURES / host))
    return {v.check: v for v in r.verdicts}


def test_grace_blackwell_image_against_gb300_and_gb200_trays(ws):
    """sglang-gb200 on one GB300 NVL72 tray (driver 580) passes the cpu, arch and driver
    checks; on a GB200 tray still on driver 570 the CUDA 13.0 image is refused by the driver
    floor, naming both versions."""
    plan = make_plan(ws, "sglang-gb200", resolve=False)
    gb300 = _verdicts(plan, "gb300-4x-sm103")
    assert gb300["cpu"].status == PASS and "aarch64 image on an aarch64 host" in gb300["cpu"].detail
    assert gb300["arch"].status == PASS and "sm103" in gb300["arch"].detail
    assert gb300["driver"].status == PASS
    gb200 = _verdicts(plan, "gb200-4x-driver-570")
    assert gb200["arch"].status == PASS and "sm100" in gb200["arch"].detail
    assert gb200["driver"].status == pf.FAIL
    assert "570.172.08" in gb200["driver"].detail and plan.min_driver in gb200["driver"].detail


def test_the_cpu_check_refuses_another_cpus_image(ws):
    """The x86_64 image of a multi-platform target on a Grace tray stops at its first exec;
    its arm64 image passes; an arm64 image on an x86_64 host is refused the same way."""
    amd, arm = (make_plan(ws, "tiny-cpu-multi", resolve=False, platform=p)
                for p in ("linux/amd64", "linux/arm64"))
    on_grace = _verdicts(amd, "gb300-4x-sm103")["cpu"]
    assert on_grace.status == pf.FAIL and "x86_64 image on an aarch64 host" in on_grace.detail
    assert "--platform linux/arm64" in on_grace.detail
    assert _verdicts(arm, "gb300-4x-sm103")["cpu"].status == PASS
    # A recording without `uname -m` cannot say: skipped, never passed.
    assert _verdicts(arm, "h100-8x-sm90")["cpu"].status == pf.SKIP
    # The live host (this machine): `imgbuild preflight` picks the target's image for it.
    r = run_imgbuild("preflight", "tiny-cpu-multi", "--json")
    d = json.loads(r.stdout)
    cpu = next(v for v in d["verdicts"] if v["check"] == "cpu")
    assert cpu["status"] == "pass", d


def test_another_cpus_uv_comes_from_its_wheel_and_emulation_is_checked():
    """Builds run uv inside the image: for an arm64 image, the same uv release's aarch64
    binary from its wheel on PyPI. Without QEMU registered, the error says how to get it."""
    from imgbuild.image.base import check_emulation, host_cpu
    from imgbuild.lock.uv import uv_bin, uv_bin_for, uv_version

    assert uv_bin_for(host_cpu(), host_cpu()) == uv_bin()
    other = "aarch64" if host_cpu() == "x86_64" else "x86_64"
    path = uv_bin_for(other, host_cpu())
    head = open(path, "rb").read(20)
    assert head[:4] == b"\x7fELF"
    assert int.from_bytes(head[18:20], "little") == {"aarch64": 183, "x86_64": 62}[other]
    assert uv_version().split()[1] in path
    with pytest.raises(EnvError) as e:
        check_emulation("riscv64")
    assert "cannot run riscv64 programs" in e.value.message and "qemu-user-static" in e.value.hint


def test_the_ci_matrix_sends_arm64_targets_to_arm_runners(ws):
    from imgbuild.ci.matrix import jobs

    by = {j.name: j for j in jobs(ws)}
    for name in ARM64:
        job = by[name].to_dict()
        assert job["platform"] == "linux/arm64" and job["cpu_arch"] == "aarch64"
        runner = job["runner"]
        assert runner == "ubuntu-24.04-arm" if not job["gpu"] else \
            runner[:4] == ["self-hosted", "linux", "arm64", "gpu"]
    assert by["sglang-blackwell-k2_6"].to_dict()["platform"] == "linux/amd64"
    assert by["tiny-cpu-multi-amd64"].runner == "ubuntu-latest"


@pytest.mark.docker
@pytest.mark.xdist_group("qemu")  # its own targets and base: beside the other docker tests
@pytest.mark.slow
def test_the_arm64_base_is_made_here_under_qemu_reproducibly(docker_client, ws):
    """debootstrap for arm64 under QEMU user emulation (about 105 s here), loaded as a
    linux/arm64 image: the filesystem digest the recipe records, and it runs (emulated)."""
    from imgbuild.image import base

    b = ws.catalog.base("debian-bookworm", "aarch64")
    res = base.bootstrap(docker_client, b, rebuild=True)
    assert res.rootfs == b.bootstrap["rootfs"]
    img = docker_client.images.get(b.image)
    assert img.attrs["Architecture"] == "arm64"
    out = docker_client.containers.run(b.image, ["python3", "-c",
                                                 "import platform; print(platform.machine())"],
                                       remove=True, network_disabled=True)
    assert out.decode().strip() == "aarch64"



# --- multi-platform targets: one lock per platform, one index ---------------------------------

MULTI = "tiny-cpu-multi"


def _target(doc: dict):
    from imgbuild.catalog.targets import parse_target

    base = {"engine": {"name": "transformers", "version": "5.17.0"}, "archs": ["cpu"],
            "os": "debian-bookworm"}
    return parse_target("t", base | doc, "images/t.yaml")


@pytest.mark.parametrize("doc, where, said", [
    ({"platforms": ["linux/riscv64"]}, "platforms[0]", "an OCI platform"),
    ({"platforms": ["linux/arm64", "linux/arm64"]}, "platforms", "each platform once"),
    ({"platforms": []}, "platforms", "at least one platform"),
    ({"platforms": "linux/arm64"}, "platforms", "a list of strings"),
    ({"cpu_arch": "aarch64"}, "cpu_arch", "unknown key"),
    ({"platforms": ["linux/amd64"], "indexes": [
        {"name": "x", "url": "https://x/simple", "platforms": ["linux/arm64"]}]},
     "indexes[0].platforms[0]", "one of the target's platforms"),
])
def test_platforms_in_a_spec_are_checked(doc, where, said):
    from imgbuild.errors import SpecError

    with pytest.raises(SpecError) as e:
        _target(doc)
    text = str(e.value) + " ".join(e.value.facts or ())
    assert where in text and said in text, text


def test_a_target_on_one_platform_keeps_only_the_indexes_that_platform_asks():
    t = _target({"platforms": ["linux/amd64", "linux/arm64"], "indexes": [
        {"name": "cpu", "url": "https://x/cpu", "platforms": ["linux/amd64"]},
        {"name": "all", "url": "https://x/all"}]})
    assert t.multi_platform and t.cpu_arch == "x86_64"
    arm = t.on("linux/arm64")
    assert (arm.platforms, arm.cpu_arch) == (("linux/arm64",), "aarch64")
    assert [ix.name for ix in arm.indexes] == ["all"]
    assert [ix.name for ix in t.on("linux/amd64").indexes] == ["cpu", "all"]
    from imgbuild.errors import InputError

    with pytest.raises(InputError) as e:
        _target({}).on("linux/arm64")
    assert "is not built for linux/arm64" in e.value.message


def test_a_multi_platform_target_is_locked_once_per_platform(ws):
    """The markers in its requirements and its per-platform index decide each lock: the x86_64
    lock takes torch's CPU build from the PyTorch index, the aarch64 one PyPI's CPU build."""
    amd, arm = ws.platform_refs(MULTI)
    assert amd.lock_path.name == f"{MULTI}.py3.11-manylinux_2_36-x86_64.txt"
    assert arm.lock_path.name == f"{MULTI}.py3.11-manylinux_2_36-aarch64.txt"
    assert amd.request.extra_index_urls == ("https://download.pytorch.org/whl/cpu",)
    assert arm.request.extra_index_urls == ()
    assert amd.request.inputs_hash() != arm.request.inputs_hash()
    assert amd.lock().package("torch").version == "2.13.0+cpu"
    assert arm.lock().package("torch").version == "2.10.0"
    # The same wheels everywhere else but the torch family: one resolution per platform.
    assert amd.lock().package("compressed-tensors").version == \
        arm.lock().package("compressed-tensors").version == "0.19.0"
    r = run_imgbuild("lock", "--check", MULTI, "--json")
    assert r.returncode == 0, r.stderr
    locks = json.loads(r.stdout)["locks"]
    assert sorted(e["lock"].rsplit("/", 1)[1] for e in locks) == sorted(
        (amd.lock_path.name, arm.lock_path.name))
    assert ws.platform_refs(MULTI, ("linux/arm64",)) == (arm,)


def test_the_index_plan_covers_each_platform_and_holds_the_moving_tags(ws):
    from imgbuild.plan.index import index_key, make_index_plan

    ix = make_index_plan(ws, MULTI, resolve=False)
    amd, arm = ix.plans
    assert (amd.platform, arm.platform) == ("linux/amd64", "linux/arm64")
    assert (amd.cpu_arch, arm.cpu_arch) == ("x86_64", "aarch64")
    assert amd.content_tag == f"{MULTI}-amd64-{amd.content_key[7:23]}"
    assert arm.content_tag == f"{MULTI}-arm64-{arm.content_key[7:23]}"
    # The moving tags are the index's alone: no platform image claims them.
    assert amd.tags == arm.tags == ()
    assert ix.tags == (MULTI, f"{MULTI}-transformers5.17.0")
    assert ix.content_key == index_key(ix.plans)
    assert ix.content_tag == f"{MULTI}-{ix.content_key[7:23]}"
    # Either platform's image changing changes the index.
    from dataclasses import replace

    assert index_key((amd, replace(arm, content_key="sha256:" + "0" * 64))) != ix.content_key
    assert arm.base_image == ws.catalog.base("debian-bookworm", "aarch64").image
    # A single-platform target keeps its own content and moving tags.
    one = make_plan(ws, "tiny-cpu", resolve=False)
    assert one.tags == ("tiny-cpu", "tiny-cpu-transformers5.17.0")
    assert one.content_tag == f"tiny-cpu-{one.content_key[7:23]}"


def test_plan_shows_every_platform_and_the_index():
    r = run_imgbuild("plan", MULTI, "--json", "--no-checks")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert sorted(d["platforms"]) == ["linux/amd64", "linux/arm64"]
    assert d["content_tag"] == d["index"]["content_tag"] and d["refs"][1:] == [
        f"imgbuild:{MULTI}", f"imgbuild:{MULTI}-transformers5.17.0"]
    r = run_imgbuild("plan", MULTI, "--platform", "arm64", "--json", "--no-checks")
    assert r.returncode == 0, r.stderr
    one = json.loads(r.stdout)
    assert one["platform"] == "linux/arm64" and one["refs"] == [
        d["platforms"]["linux/arm64"]["refs"][0]]


@pytest.mark.parametrize("args, said", [
    (("plan", "tiny-cpu", "--platform", "linux/arm64"), "target 'tiny-cpu' is not built for "
                                                        "linux/arm64"),
    (("plan", MULTI, "--platform", "linux/s390x"), "--platform linux/s390x: not a platform"),
    (("plan", MULTI, "--platform", ","), "--platform has an empty entry"),
    (("build", "tiny-cpu", "--platform", "linux/arm64"), "is not built for linux/arm64"),
    (("pull", MULTI, "--platform", "linux/amd64,linux/arm64", "--registry", "127.0.0.1:9/x"),
     "pull takes one --platform"),
    (("index", "tiny-cpu", "--registry", "127.0.0.1:9/x"), "names one platform"),
    (("index", "--registry", "127.0.0.1:9/x"), "name the targets whose index to assemble"),
])
def test_platform_refusals_are_input_errors(args, said):
    r = run_imgbuild(*args)
    text = " ".join(r.stderr.split())
    assert r.returncode == 2 and said in text and "Traceback" not in text, text


def _one_platform_alone_is_pushed_without_an_index(registry_repo: str) -> None:
    """tiny-cpu-multi for linux/amd64 alone: its content tag is pushed, the index is not
    assembled and no moving tag is set; `imgbuild index` refuses, naming the missing platform."""
    from imgbuild.image import registry

    repo = registry.Repository.parse(registry_repo)
    r = run_imgbuild(MULTI, "--platform", "linux/amd64", "--push", "--registry", registry_repo,
                     "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    first = json.loads(r.stdout)
    assert list(first["platforms"]) == ["linux/amd64"] and "only linux/amd64" in first["held"]
    assert first["index"]["digest"] is None
    assert registry.manifest_digest(repo, MULTI) is None
    assert registry.manifest_digest(repo, first["platforms"]["linux/amd64"]["content_tag"]
                                    .split(":")[-1]) is not None
    r = run_imgbuild("index", MULTI, "--registry", registry_repo)
    said = " ".join(r.stderr.split())
    assert r.returncode == 1 and "linux/arm64:" in said and "is not in the registry" in said, said
    assert registry.manifest_digest(repo, MULTI) is None


@pytest.mark.docker
@pytest.mark.xdist_group("qemu")  # its own targets: beside the other docker tests
def test_one_platform_of_a_multi_platform_target_is_pushed_and_no_index_made(own_repo):
    _one_platform_alone_is_pushed_without_an_index(own_repo)


@pytest.mark.docker
@pytest.mark.xdist_group("qemu")  # its own targets and base: beside the other docker tests
# The arm64 image built and smoke-tested under QEMU, on a new machine its base bootstrapped
# under QEMU first: 14 min of one worker in a `make test` from nothing on two cores (850 s
# of the suite's 5,028 test-seconds), where the test above keeps the one-platform half.
@pytest.mark.slow
def test_multi_platform_build_publishes_one_index_that_pull_reads_from_either_side(
        docker_client, own_repo, arm64_base):
    """tiny-cpu-multi for linux/amd64 and linux/arm64 (built here under QEMU: every RUN step
    and the smoke test run as aarch64 code), each smoke-tested and pushed with its report, SBOM
    and provenance; the index only once both passed; pulled as this host and as an arm64 host.
    """
    from imgbuild.image import attest, registry

    registry_repo = own_repo
    repo = registry.Repository.parse(registry_repo)
    _one_platform_alone_is_pushed_without_an_index(registry_repo)

    # Both: arm64 built under emulation, amd64 reused, then the index.
    r = run_imgbuild(MULTI, "--push", "--registry", registry_repo, "--json", timeout=3600)
    assert r.returncode == 0, r.stderr[-3000:]
    d = json.loads(r.stdout)
    amd, arm = d["platforms"]["linux/amd64"], d["platforms"]["linux/arm64"]
    assert amd["action"] == "local" and arm["action"] in ("built", "local")
    stages = {s["name"]: s for s in arm["smoke"]["stages"]}
    assert stages["checkpoint-cpu"]["status"] == "pass", stages["checkpoint-cpu"]["reason"]
    img = docker_client.images.get(arm["content_tag"])
    assert img.attrs["Architecture"] == "arm64"
    assert img.labels["io.imgbuild.platform"] == "manylinux_2_36_aarch64"
    # Here (amd64) the moving tags point at this host's image.
    assert docker_client.images.get(f"{registry_repo}:{MULTI}").id == \
        docker_client.images.get(amd["content_tag"]).id

    digest = d["index"]["digest"]
    found = registry.fetch_index(repo, d["index"]["content_tag"])
    assert found is not None and found[0] == digest
    listed = found[1]
    assert listed == {"linux/amd64": registry.manifest_digest(repo, amd["content_tag"].split(":")[-1]),
                      "linux/arm64": registry.manifest_digest(repo, arm["content_tag"].split(":")[-1])}
    for tag in (MULTI, f"{MULTI}-transformers5.17.0"):
        assert registry.manifest_digest(repo, tag) == digest
    raw = repo.api.request("GET", f"{repo.path}/manifests/{MULTI}", scope=repo.scope("pull"),
                           headers={"Accept": registry.OCI_INDEX}).json()
    assert raw["mediaType"] == "application/vnd.oci.image.index.v1+json"
    assert [m["platform"] for m in raw["manifests"]] == [
        {"os": "linux", "architecture": "amd64"}, {"os": "linux", "architecture": "arm64"}]
    # Report, SBOM and provenance per platform manifest.
    for platform, m in listed.items():
        assert registry.fetch_report(repo, m)["ok"] is True, platform
        v = attest.verify(repo, d["platforms"][platform]["content_tag"].split(":")[-1],
                          lock=None)
        assert all(ok for _, ok, _ in v.checks), (platform, v.checks)

    # Pulled as this host (amd64) and as an arm64 host would.
    for ref in (f"{registry_repo}:{MULTI}", amd["content_tag"], arm["content_tag"]):
        docker_client.images.remove(ref, force=True)
    r = run_imgbuild("pull", MULTI, "--registry", registry_repo, "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    p = json.loads(r.stdout)
    assert (p["platform"], p["platform_why"]) == ("linux/amd64", "this host's platform")
    assert p["digest"] == listed["linux/amd64"] and p["index_digest"] == digest
    assert docker_client.images.get(f"{registry_repo}:{MULTI}").attrs["Architecture"] == "amd64"
    r = run_imgbuild("pull", MULTI, "--platform", "linux/arm64", "--registry", registry_repo)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "linux/arm64 (asked for with --platform)" in " ".join(r.stdout.split())
    got = docker_client.images.get(f"{registry_repo}:{MULTI}")
    assert got.attrs["Architecture"] == "arm64"
    # The Engine itself reads the index: asked for arm64 by the moving tag, it gets that image.
    via_engine = docker_client.images.pull(registry_repo, tag=MULTI, platform="linux/arm64")
    assert via_engine.id == got.id
    # Assembled again from the registry alone (CI's index job): the same bytes, the same digest.
    r = run_imgbuild("index", MULTI, "--registry", registry_repo, "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout)["indexes"][0]["digest"] == digest
    # `verify` on the index checks each platform's image against its own lock.
    r = run_imgbuild("verify", f"{registry_repo}:{MULTI}", "--json")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    v = json.loads(r.stdout)
    assert v["index_digest"] == digest and sorted(v["platforms"]) == ["linux/amd64", "linux/arm64"]
    for platform, doc in v["platforms"].items():
        checks = {c["check"]: c for c in doc["checks"]}
        cpu = "aarch64" if platform == "linux/arm64" else "x86_64"
        assert checks["lock"]["ok"] and f"-{cpu}.txt is the lock" in checks["lock"]["detail"]
    # --no-smoke: nothing may move, and the output says which platform held it and why.
    r = run_imgbuild(MULTI, "--no-smoke", "--registry", registry_repo, "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    held = json.loads(r.stdout)["held"]
    assert "linux/amd64: no smoke test ran (--no-smoke)" in held and "linux/arm64: " in held


def test_the_index_plan_makes_each_platform_s_plan_with_the_same_options(ws, monkeypatch):
    """Every platform's image is planned with what the index was asked for: the model,
    repository, arch and flavor overrides, the forced rebuild and whether to resolve, with
    make_plan's own defaults where nothing was asked."""
    from imgbuild.plan import index

    asked: list[dict] = []

    def recording(ws_, target, **kw):
        asked.append(kw)
        return make_plan(ws_, target, **kw)

    monkeypatch.setattr(index, "make_plan", recording)
    index.make_index_plan(ws, MULTI)
    assert asked == [dict(model=None, repository="imgbuild", resolve=True, archs=None,
                          flavor=None, forced=False, platform=p)
                     for p in ("linux/amd64", "linux/arm64")]
    asked.clear()
    ix = index.make_index_plan(ws, MULTI, model="tiny-nvfp4", repository="r.example/x",
                               resolve=False, archs=("cpu",), flavor="devel", forced=True)
    assert asked == [dict(model="tiny-nvfp4", repository="r.example/x", resolve=False,
                          archs=("cpu",), flavor="devel", forced=True, platform=p)
                     for p in ("linux/amd64", "linux/arm64")]
    # The model names the index and its tags, as it names a single-platform image's.
    assert ix.model == "tiny-nvfp4" and ix.repository == "r.example/x"
    stem = f"{MULTI}-tiny-nvfp4"
    assert ix.content_tag == f"{stem}-{ix.content_key[7:23]}"
    assert ix.tags == (stem, f"{stem}-transformers5.17.0")
    assert ix.refs[0] == f"r.example/x:{ix.content_tag}"


def test_the_index_key_does_not_follow_the_order_platforms_are_listed_in(ws):
    from imgbuild.plan.index import index_key, make_index_plan

    amd, arm = make_index_plan(ws, MULTI, resolve=False).plans
    assert index_key((amd, arm)) == index_key((arm, amd))
    assert index_key((amd,)) != index_key((arm,))
