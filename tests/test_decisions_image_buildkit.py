"""The `docker build` command imgbuild runs for each export (image/buildkit.py build_args), and
what it reads from BuildKit's log (which step failed, which cache was not read, uv's sizes, a
base that cannot be pulled), decided on plain data without the Docker Engine."""

from __future__ import annotations

from collections import deque
from pathlib import Path

import pytest

from imgbuild.errors import EnvError
from imgbuild.image import buildkit
from imgbuild.image.buildkit import SOURCE_DATE_EPOCH, Export
from imgbuild.image.context import Secrets
from imgbuild.plan.decide import make_plan

from .conftest import checkout_workspace

CACHE = "127.0.0.1:5000/r:tiny-cpu-buildcache-max"
CTX = Path("/scratch/ctx")


@pytest.fixture(scope="module")
def plan():
    return make_plan(checkout_workspace(), "tiny-cpu", resolve=False,
                     repository="127.0.0.1:5000/r")


def args_of(plan, *, export=None, sink=False, tag=None, cache_from=(), no_cache=False,
            environ=None, host=None, secrets=None):
    return buildkit.build_args(plan, CTX, secrets=secrets or Secrets(), flags="--find-links /w",
                               no_cache=no_cache, cache_from=cache_from, tag=tag, sink=sink,
                               export=export or Export(), environ=environ or {},
                               host=host or plan.cpu_arch)


def after(args: list[str], flag: str) -> list[str]:
    return [args[i + 1] for i, a in enumerate(args) if a == flag]


def test_the_default_build_tags_the_content_tag_and_writes_its_id(plan):
    args, export = args_of(plan)
    assert export == Export()
    assert args[:2] == ["build", "--progress=plain"] and args[-1] == str(CTX)
    assert after(args, "--iidfile") == [str(CTX / "image-id")]
    assert after(args, "-t") == [plan.ref()]
    assert "--output" not in args and "-o" not in args
    assert "BUILDKIT_INLINE_CACHE=1" in after(args, "--build-arg")
    assert "IMGBUILD_INDEX_FLAGS=--find-links /w" in after(args, "--build-arg")
    assert after(args, "--label") == [f"io.imgbuild.content-key={plan.content_key}"]
    assert "--platform" not in args and "--no-cache" not in args
    args, _ = args_of(plan, tag="r:other", no_cache=True)
    assert after(args, "-t") == ["r:other"] and "--no-cache" in args


def test_a_reproducible_build_goes_to_an_oci_archive_untagged(plan):
    args, export = args_of(plan, export=Export(reproducible=True, compression="zstd"))
    assert export.reproducible
    assert "--iidfile" not in args and "-t" not in args
    out = after(args, "--output")
    assert out == [f"type=oci,dest=/scratch/ctx.oci.tar,name={plan.ref()},rewrite-timestamp=true,"
                   "compression=zstd,force-compression=true"]
    assert f"SOURCE_DATE_EPOCH={SOURCE_DATE_EPOCH}" in after(args, "--build-arg")


def test_a_tar_sink_gets_the_filesystem_without_image_or_inline_cache(plan):
    asked = Export(reproducible=True, compression="zstd", cache_to=CACHE, cache_from=(CACHE,))
    args, export = args_of(plan, export=asked, sink=True)
    # Only the registry cache to read is kept: nothing written, nothing loaded.
    assert export == Export(cache_from=(CACHE,))
    assert after(args, "-o") == ["type=tar,dest=-"]
    assert "--output" not in args and "--iidfile" not in args and "-t" not in args
    assert "--cache-to" not in args
    assert "BUILDKIT_INLINE_CACHE=1" not in after(args, "--build-arg")
    assert after(args, "--cache-from") == [f"type=registry,ref={CACHE}"]


def test_the_registry_cache_is_read_alone_else_the_images_inline_caches(plan):
    refs = ("r:tiny-cpu-a", "r:tiny-cpu-b")
    args, _ = args_of(plan, cache_from=refs)
    assert after(args, "--cache-from") == list(refs)
    args, _ = args_of(plan, cache_from=refs, export=Export(cache_from=(CACHE,), cache_to=CACHE))
    assert after(args, "--cache-from") == [f"type=registry,ref={CACHE}"]
    assert after(args, "--cache-to") == [f"type=registry,ref={CACHE},mode=max,ignore-error=true"]


def test_another_cpus_image_is_built_for_its_platform(plan):
    args, _ = args_of(plan, host="aarch64")
    assert after(args, "--platform") == ["linux/amd64"]
    args, _ = args_of(plan, host=plan.cpu_arch)
    assert "--platform" not in args


def test_secrets_and_proxies_by_name_only(plan, tmp_path):
    ca, netrc = tmp_path / "ca.crt", tmp_path / "netrc"
    args, _ = args_of(plan, secrets=Secrets(ca, netrc),
                      environ={"HTTPS_PROXY": "http://u:secret@p:3128", "no_proxy": "x",
                               "HTTP_PROXY": ""})
    assert after(args, "--secret") == [f"id=cacert,src={ca}", f"id=netrc,src={netrc}"]
    assert "HTTPS_PROXY" in after(args, "--build-arg") and "no_proxy" in after(args, "--build-arg")
    assert "HTTP_PROXY" not in after(args, "--build-arg")  # set but empty: not passed
    assert not any("secret@" in a for a in args)
    assert buildkit.proxy_args({}) == []


# --- what BuildKit's log says -----------------------------------------------------------------

def log(**steps: list[str]) -> dict[str, deque[str]]:
    return {sid.lstrip("s"): deque(lines) for sid, lines in steps.items()}


def test_the_failed_step_is_the_first_with_an_error_a_missed_cache_aside():
    by_step = log(s3=["#3 importing cache manifest from r:x", "#3 ERROR: r:x: not found"],
                  s5=["#5 [2/7] RUN a", "#5 DONE 1.0s"],
                  s7=["#7 [3/7] RUN b", "#7 ERROR: process did not complete"],
                  s9=["#9 ERROR: canceled"])
    importing = {"3": "r:x"}
    assert buildkit.failed_step(by_step, importing) == "7"
    assert buildkit.failed_step(by_step, {}) == "3"
    assert buildkit.failed_step(log(s5=["#5 DONE"]), {}) is None
    assert buildkit.missed_caches(importing, by_step) == {"3"}
    assert buildkit.missed_caches({"3": "r:x", "4": "r:y"}, by_step) == {"3"}  # 4 read, or silent
    assert buildkit.missed_caches({"5": "r:z"}, by_step) == set()


@pytest.mark.parametrize("number,unit,want", [("1.5", "MiB", 3 * 2**19), ("2", "KiB", 2048),
                                              ("1", "GiB", 2**30), ("300", "B", 300),
                                              ("0.5", "TiB", 2**39)])
def test_uvs_sizes_are_read_in_binary_units(number, unit, want):
    assert buildkit._size(number, unit) == want


def test_a_step_title_drops_mounts_and_stays_short():
    assert buildkit._title("RUN --mount=type=cache,target=/root/.cache uv pip install x") == \
        "RUN uv pip install x"
    long = "RUN " + "a" * 100
    assert len(buildkit._title(long)) == 80 and buildkit._title(long).endswith("…")
    assert buildkit._title("RUN " + "a" * 76) == "RUN " + "a" * 76


def test_a_base_that_cannot_be_pulled_is_the_environments_fault(plan):
    lines = ["#2 [internal] load metadata for docker.io/nvidia/cuda:12.8.1-base",
             "#2 ERROR: failed to do request: dial tcp: lookup registry-1.docker.io: no such host"]
    err = buildkit._unpullable_base(plan, lines)
    assert isinstance(err, EnvError)
    assert "docker.io/nvidia/cuda:12.8.1-base" in err.facts[0] and "no such host" in err.facts[0]
    # A failing step that is not the base's metadata, or metadata read without an error, or an
    # error that is not the network's: the build's own failure.
    assert buildkit._unpullable_base(plan, ["#7 [3/7] RUN x", "#7 ERROR: no such host"]) is None
    assert buildkit._unpullable_base(plan, ["#2 load metadata for x", "#2 DONE 0.1s",
                                            "no such host"]) is None
    assert buildkit._unpullable_base(plan, ["#2 load metadata for x",
                                            "#2 ERROR: exit code 1"]) is None


def test_an_unpullable_base_word_for_word(plan):
    lines = ["#1 [internal] load build definition from Dockerfile",
             "#2 [internal] load metadata for docker.io/nvidia/cuda:12.8.1-base",
             "#2 ERROR: failed to do request: Head \"https://registry-1.docker.io/v2/\": "
             "ERROR: dial tcp: lookup registry-1.docker.io: no such host"]
    err = buildkit._unpullable_base(plan, lines)
    assert err.message == f"the base image {plan.base_image} cannot be pulled from this machine"
    # The first error line, after its first " ERROR: " only (the rest is BuildKit's own words).
    assert err.facts == [
        "BuildKit: load metadata for docker.io/nvidia/cuda:12.8.1-base: failed to do request: "
        "Head \"https://registry-1.docker.io/v2/\": ERROR: dial tcp: lookup registry-1.docker.io: "
        "no such host",
        f"target {plan.target} builds FROM it ({plan.flavor} flavor)"]
    # On the Debian base already: no word about changing the OS.
    assert err.hint == ("give the Engine a registry mirror that holds it (`registry-mirrors` in "
                        "/etc/docker/daemon.json); or build another flavor on a base made here: "
                        "`--flavor devel` (nvcc from NVIDIA's wheels on PyPI) or `--flavor slim` "
                        "(no nvcc)")
    long = lines[:2] + ["#2 ERROR: failed to do request: " + "x" * 400]
    fact = buildkit._unpullable_base(plan, long).facts[0]
    assert fact == ("BuildKit: load metadata for docker.io/nvidia/cuda:12.8.1-base: "
                    + ("failed to do request: " + "x" * 400)[:300])
