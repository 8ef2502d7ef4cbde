"""Which donor layers a splice may reuse (image/splice.py), decided on a real recorded config
(tests/fixtures/inline-cache/first.json: tiny-cpu as Docker Engine 20.10 built it) and a lock
part read from a real tar layer made in memory, without a registry or the Docker Engine."""

from __future__ import annotations

import copy
import gzip
import io
import json
import tarfile
from pathlib import Path

import pytest

from imgbuild.image import splice
from imgbuild.image.compression import DOCKER_GZIP, GZIP, ZSTD
from imgbuild.plan.render import ASSETS

RECORDED = Path(__file__).parent / "fixtures" / "inline-cache"
HEAVY_TEXT = "torch==2.13.0 --hash=sha256:" + "ab" * 32 + "\n"
PATH = f"{ASSETS}/heavy.txt"


def recorded() -> dict:
    return json.loads((RECORDED / "first.json").read_text())


def manifest_of(config: dict, media_type: str = GZIP.media_type) -> dict:
    return {"layers": [{"mediaType": media_type, "digest": f"sha256:{i:064x}", "size": 100 + i}
                       for i in range(len(config["rootfs"]["diff_ids"]))]}


def tar_of(path: str, text: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        info = tarfile.TarInfo(path.lstrip("/"))
        data = text.encode()
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


class Layers:
    """The registry's layer blobs of the donor, as files read from real tars (the heavy
    part's `COPY` layer at index 2, as the recorded build made it)."""

    def __init__(self, text: str | None = HEAVY_TEXT, at: int = 2):
        self.blobs = {f"sha256:{at:064x}": tar_of(PATH, text) if text is not None
                      else tar_of("/opt/other.txt", "x")}
        self.asked: list[tuple[str, str]] = []

    def __call__(self, layer: dict, path: str) -> bytes | None:
        self.asked.append((layer["digest"], path))
        blob = self.blobs.get(layer["digest"])
        if blob is None:
            return None
        with tarfile.open(fileobj=io.BytesIO(blob)) as tf:
            try:
                f = tf.extractfile(path.lstrip("/"))
            except KeyError:
                return None
            return f.read() if f is not None else None


def donor(config=None, manifest=None, texts=None, comp=GZIP, layers=None):
    config = config if config is not None else recorded()
    manifest = manifest if manifest is not None else manifest_of(config)
    return splice.donor_from("prev", "sha256:" + "d" * 64, manifest, config,
                             texts if texts is not None else {"heavy": HEAVY_TEXT}, comp,
                             layers if layers is not None else Layers())


def test_an_image_with_this_builds_heavy_layers_is_a_donor_of_exactly_them():
    cfg = recorded()
    m = manifest_of(cfg)
    layers = Layers()
    got, why = donor(cfg, m, layers=layers)
    assert why == "" and got is not None
    assert (got.ref, got.digest) == ("prev", "sha256:" + "d" * 64)
    assert got.before == 4 and got.first_layer == 2
    assert got.history == tuple(cfg["history"][4:6])
    assert got.layers == tuple(m["layers"][2:4])
    assert got.diff_ids == tuple(cfg["rootfs"]["diff_ids"][2:4])
    assert got.manifest is m and got.config is cfg
    # The lock part is read from the heavy step's own COPY layer, at the path it was copied to.
    assert layers.asked == [(f"sha256:{2:064x}", PATH)]


def test_another_lock_part_or_none_is_no_donor():
    got, why = donor(texts={"heavy": HEAVY_TEXT.replace("2.13.0", "2.14.0")})
    assert got is None and why == "its heavy lock part is not this build's"
    got, why = donor(layers=Layers(text=None))
    assert got is None and why == "its heavy lock part is not this build's"
    got, why = donor(layers=Layers(at=3))  # the part in another layer than its COPY step's
    assert got is None and "lock part" in why


def test_heavy_layers_in_another_compression_are_no_donor():
    cfg = recorded()
    got, why = donor(cfg, manifest_of(cfg, ZSTD.media_type))
    assert got is None and ZSTD.media_type in why and GZIP.media_type in why
    got, why = donor(cfg, manifest_of(cfg, GZIP.media_type), comp=ZSTD)
    assert got is None and "this push writes " + ZSTD.media_type in why
    # Docker's gzip is gzip.
    got, _ = donor(cfg, manifest_of(cfg, DOCKER_GZIP))
    assert got is not None
    # Only the heavy layers' compression counts: the rest are the top's to send.
    m = manifest_of(cfg)
    m["layers"][0]["mediaType"] = ZSTD.media_type
    m["layers"][5]["mediaType"] = ZSTD.media_type
    got, _ = donor(cfg, m)
    assert got is not None
    m["layers"][3]["mediaType"] = ZSTD.media_type  # the heavy RUN's layer
    assert donor(cfg, m)[0] is None


def test_a_history_that_does_not_say_which_step_made_which_layer_is_no_donor():
    cfg = recorded()
    m = manifest_of(cfg)
    m["layers"].pop()
    assert donor(cfg, m) == (None, "its history does not say which step made which layer")
    cfg = recorded()
    cfg["rootfs"]["diff_ids"].pop()
    assert donor(cfg, manifest_of(recorded()))[1] == \
        "its history does not say which step made which layer"
    cfg = recorded()
    cfg["history"][2]["empty_layer"] = False  # an ENV said to make a layer
    assert donor(cfg, manifest_of(recorded()))[0] is None


def test_as_many_heavy_steps_as_this_build_has_parts():
    got, why = donor(texts={"heavy-a": HEAVY_TEXT, "heavy-b": HEAVY_TEXT})
    assert got is None and why == "it has 1 heavy install steps, this build 2"


def test_heavy_steps_that_are_not_this_builds_are_no_donor():
    cfg = recorded()
    cfg["history"][4]["created_by"] = cfg["history"][4]["created_by"].replace(
        "COPY ", "ADD ")
    got, why = donor(cfg)
    assert got is None and "not this build's (heavy)" in why
    cfg = recorded()
    cfg["history"][4]["created_by"] = "COPY lock/heavy.txt /opt/elsewhere/heavy.txt # buildkit"
    assert donor(cfg)[0] is None


def test_a_spliced_config_puts_the_donors_layers_back_where_the_full_build_has_them():
    full = recorded()
    d, _ = donor(full)
    top = copy.deepcopy(full)
    del top["history"][4:6]
    del top["rootfs"]["diff_ids"][2:4]
    got = json.loads(splice.spliced_config(d, json.dumps(top).encode()))
    assert got["rootfs"]["diff_ids"] == full["rootfs"]["diff_ids"]
    assert got["history"] == full["history"]


def test_the_cut_rest_layer_goes_where_its_build_step_would_have_put_it():
    cfg = {"rootfs": {"diff_ids": ["a", "b", "c"]}, "history": [{"n": 0}, {"n": 1}, {"n": 2}]}
    rest = splice.CutLayer(history_at=1, layer_at=2, history={"n": "rest"}, diff_id="r",
                           descriptor={}, tar_size=0)
    got = json.loads(splice.with_rest(json.dumps(cfg).encode(), rest))
    assert got["rootfs"]["diff_ids"] == ["a", "b", "r", "c"]
    assert got["history"] == [{"n": 0}, {"n": "rest"}, {"n": 1}, {"n": 2}]


def test_the_rest_layers_history_is_made_only_from_the_donors_own_install():
    d, _ = donor()
    (part, same), = splice._heavy_installs(d)
    assert part == "heavy" and f"-r {ASSETS}/rest.txt" in same and f"{ASSETS}/heavy.txt" not in same
    command = same.removesuffix(" # buildkit")
    got = splice.rest_history(d, command, "--find-links /w", "2026-01-01T00:00:00Z")
    assert got == {"created": "2026-01-01T00:00:00Z",
                   "created_by": f"RUN |1 IMGBUILD_INDEX_FLAGS=--find-links /w /bin/sh -c {same}",
                   "comment": d.history[1].get("comment", "buildkit.dockerfile.v0")}
    assert splice.rest_history(d, command + " --no-compile", "", "t") is None


def test_a_layer_blob_is_read_back_in_its_compression():
    tar = tar_of(PATH, HEAVY_TEXT)
    assert splice.decompressed(GZIP.media_type, gzip.compress(tar)) == tar
    assert splice.decompressed(DOCKER_GZIP, gzip.compress(tar)) == tar
    assert splice.decompressed("application/vnd.oci.image.layer.v1.tar", tar) == tar


@pytest.mark.parametrize("by,command", [
    ("RUN |1 IMGBUILD_INDEX_FLAGS=--x /bin/sh -c uv pip install # buildkit",
     "uv pip install # buildkit"),
    ("RUN /bin/sh -c a /bin/sh -c b", "a /bin/sh -c b"),
    ("COPY x y", "COPY x y"),
])
def test_a_steps_command_leaves_out_its_build_arguments(by, command):
    assert splice._command(by) == command


# --- the spliced image: where each layer goes, what it cost -----------------------------------

def top_layers(n: int, sent: int = 0) -> splice.wire.Layers:
    from imgbuild.image import imagecheck, wire

    descs = tuple({"mediaType": GZIP.media_type, "digest": f"sha256:{0xf00 + i:064x}",
                   "size": 10 + i} for i in range(n))
    facts = tuple(imagecheck.LayerFact(d["digest"], d["size"], f"sha256:{0xa00 + i:064x}",
                                       "sent" if i < sent else "found")
                  for i, d in enumerate(descs))
    return wire.Layers("sha256:top", tuple(f.diff_id for f in facts), descs, b"{}",
                       sum(d["size"] for d in descs[:sent]), sent, n - sent, 0, "sha256:cfg",
                       facts)


def test_the_spliced_manifest_names_the_donors_layers_between_the_tops():
    from imgbuild.image import wire

    d, _ = donor()
    d = splice.Donor(d.ref, d.digest, d.manifest, d.config, d.before, d.history, d.first_layer,
                     ({**d.layers[0], "annotations": {wire.TAR_SIZE: "5000"}}, d.layers[1]),
                     d.diff_ids)
    top = top_layers(7, sent=3)
    got = splice.spliced_image(d, top, 1000, None, b'{"c": 1}', "sha256:conf", "reg/r")
    m = json.loads(got.manifest)
    assert m["config"] == {"mediaType": wire.OCI_CONFIG, "digest": "sha256:conf", "size": 8}
    assert [la["digest"] for la in m["layers"]] == (
        [x["digest"] for x in top.descriptors[:2]] + [la["digest"] for la in d.layers]
        + [x["digest"] for x in top.descriptors[2:]])
    assert [f.how for f in got.facts] == ["sent", "sent", "found", "found", "sent", "found",
                                          "found", "found", "found"]
    assert [f.diff_id for f in got.facts[2:4]] == list(d.diff_ids)
    assert [f.digest for f in got.facts] == [la["digest"] for la in m["layers"]]
    # Unpacked size: the top's, and each heavy layer's tar size where recorded, else its size.
    assert got.size_bytes == 1000 + 5000 + d.layers[1]["size"]
    assert got.heavy_layers == 2 and got.donor == f"reg/r@{d.digest}"
    assert got.pushed is top and got.config_digest == "sha256:conf"
    assert got.config == b'{"c": 1}'  # the config as uploaded, for the checks before the PUT


def test_a_cut_rest_layer_is_counted_as_sent_and_placed_where_it_belongs():
    d, _ = donor()
    top = top_layers(6, sent=2)
    rest = splice.CutLayer(history_at=5, layer_at=3,
                           history={"created_by": "rest"}, diff_id="sha256:rest",
                           descriptor={"mediaType": GZIP.media_type, "digest": "sha256:restblob",
                                       "size": 77}, tar_size=7000)
    got = splice.spliced_image(d, top, 1000, rest, b"{}", "sha256:conf", "reg/r")
    m = json.loads(got.manifest)
    # The rest layer at 3 among the top's, which is 5 once the 2 heavy layers are in.
    assert m["layers"][5]["digest"] == "sha256:restblob" and len(m["layers"]) == 9
    assert got.facts[5] == splice.imagecheck.LayerFact("sha256:restblob", 77, "sha256:rest", "sent")
    assert got.pushed.sent_layers == 3 and got.pushed.sent_bytes == top.sent_bytes + 77
    assert got.size_bytes == 1000 + 7000 + sum(la["size"] for la in d.layers)


# --- finding a donor in the registry ----------------------------------------------------------
# The registry scripted as Distribution answers: each tag's image for the platform, and its layer
# blobs, compressed as pushed. donor_from (above) judges each; find_donor picks the first.

def _gz(data: bytes) -> bytes:
    import gzip

    return gzip.compress(data, mtime=0)


@pytest.fixture()
def held(monkeypatch):
    """tag -> (digest, manifest, config); digest -> blob."""
    h = {"images": {}, "blobs": {}, "asked": []}

    def platform_image(repo, tag, platform):
        h["asked"].append((tag, platform))
        return h["images"].get(tag)
    monkeypatch.setattr(splice.registry, "platform_image", platform_image)
    h["blob_repos"] = []
    monkeypatch.setattr(splice.registry, "get_blob",
                        lambda repo, d: h["blob_repos"].append(repo) or h["blobs"][d])
    monkeypatch.setattr(splice, "heavy_texts", lambda plan, lock: {"heavy": HEAVY_TEXT})
    return h


def _image(h, tag: str, text: str):
    cfg = recorded()
    manifest = manifest_of(cfg)
    for la in manifest["layers"]:  # each image its own blobs
        la["digest"] = la["digest"][:-len(tag)] + tag
    h["images"][tag] = ("sha256:" + tag.encode().hex().ljust(64, "0")[:64], manifest, cfg)
    h["blobs"][manifest["layers"][2]["digest"]] = _gz(tar_of(PATH, text))


def test_the_first_tag_whose_heavy_layers_are_this_builds_is_the_donor(held):
    from types import SimpleNamespace

    repo = splice.registry.Repository.parse("127.0.0.1:5000/acme")
    _image(held, "other-lock", "numpy==1.0\n")
    _image(held, "same-lock", HEAVY_TEXT)
    plan = SimpleNamespace(platform="linux/arm64")
    refs = [f"{repo.name}:missing", f"{repo.name}:other-lock", f"{repo.name}:other-lock",
            f"{repo.name}:same-lock", f"{repo.name}:never-asked"]
    got, why = splice.find_donor(repo, plan, None, refs, GZIP)
    assert got is not None and got.ref == "same-lock"
    assert got.digest == held["images"]["same-lock"][0]
    assert why == [f"{repo.name}:other-lock: its heavy lock part is not this build's"]
    assert held["blob_repos"] and all(r is repo for r in held["blob_repos"])
    # each tag asked once, for this plan's platform, and none after the donor
    assert held["asked"] == [("missing", "linux/arm64"), ("other-lock", "linux/arm64"),
                             ("same-lock", "linux/arm64")]


def test_no_donor_among_the_tags_says_why_for_each(held):
    from types import SimpleNamespace

    repo = splice.registry.Repository.parse("127.0.0.1:5000/acme")
    _image(held, "a", "numpy==1.0\n")
    got, why = splice.find_donor(repo, SimpleNamespace(platform="linux/amd64"), None,
                                 [f"{repo.name}:a"], GZIP)
    assert got is None and why == [f"{repo.name}:a: its heavy lock part is not this build's"]


def test_a_file_is_read_from_a_layer_in_its_compression_or_is_not_there(held):
    repo = splice.registry.Repository.parse("127.0.0.1:5000/acme")
    held["blobs"]["sha256:g"] = _gz(tar_of(PATH, "in gzip\n"))
    layer = {"mediaType": GZIP.media_type, "digest": "sha256:g"}
    assert splice._file_in_layer(repo, layer, PATH) == b"in gzip\n"
    assert splice._file_in_layer(repo, layer, "/opt/not-there.txt") is None
    import tarfile as tf_mod

    buf = io.BytesIO()
    with tf_mod.open(fileobj=buf, mode="w") as t:
        d = tf_mod.TarInfo(PATH.lstrip("/"))
        d.type = tf_mod.DIRTYPE  # a directory where the file would be: no bytes
        t.addfile(d)
    held["blobs"]["sha256:dir"] = _gz(buf.getvalue())
    assert splice._file_in_layer(repo, {"mediaType": GZIP.media_type, "digest": "sha256:dir"},
                                 PATH) is None


def test_the_heavy_parts_a_build_reads_are_its_lock_parts():
    from imgbuild.plan.decide import make_plan

    from .conftest import checkout_workspace

    ws = checkout_workspace()
    for name in ("tiny-cpu", "sglang-blackwell"):
        plan = make_plan(ws, name, resolve=False)
        lock = ws.target(name).lock()
        texts = splice.heavy_texts(plan, lock)
        assert tuple(texts) == splice.heavy_parts(plan)
        if plan.split_heavy:
            assert splice.heavy_parts(plan) == splice.HEAVY_LAYERS
            assert texts == {p: lock.requirements_text(layer=p) for p in splice.HEAVY_LAYERS}
        else:
            assert texts == {"heavy": lock.requirements_text(heavy=True)}


def _two_parts() -> dict:
    """The recorded config with a second heavy part (heavy-torch) after the first, as a
    build of a target with two heavy lock parts lays its steps out: COPY then RUN each."""
    cfg = recorded()
    h = cfg["history"]
    copy_step = dict(h[4], created_by=h[4]["created_by"].replace("heavy.txt", "heavy-torch.txt"))
    run_step = dict(h[5], created_by=h[5]["created_by"].replace("heavy.txt", "heavy-torch.txt"))
    cfg["history"] = h[:6] + [copy_step, run_step] + h[6:]
    ids = cfg["rootfs"]["diff_ids"]
    cfg["rootfs"]["diff_ids"] = ids[:4] + ["sha256:" + "7" * 64, "sha256:" + "8" * 64] + ids[4:]
    return cfg


def test_a_donor_of_two_heavy_parts_is_judged_part_by_part():
    cfg = _two_parts()
    m = manifest_of(cfg)
    torch_text = "torch==2.13.0 --hash=sha256:" + "cd" * 32 + "\n"
    layers = Layers()
    layers.blobs[f"sha256:{4:064x}"] = tar_of(f"{ASSETS}/heavy-torch.txt", torch_text)
    got, why = donor(cfg, m, texts={"heavy": HEAVY_TEXT, "heavy-torch": torch_text},
                     layers=layers)
    assert why == "" and got is not None
    assert got.layers == tuple(m["layers"][2:6])
    assert got.diff_ids == tuple(cfg["rootfs"]["diff_ids"][2:6])
    assert got.history == tuple(cfg["history"][4:8]) and got.first_layer == 2
    assert layers.asked == [(f"sha256:{2:064x}", PATH),
                            (f"sha256:{4:064x}", f"{ASSETS}/heavy-torch.txt")]
    got, why = donor(cfg, m, texts={"heavy": HEAVY_TEXT, "heavy-torch": "torch==0\n"},
                     layers=layers)
    assert got is None and why == "its heavy-torch lock part is not this build's"
    # The second part's steps named for another file: not this build's steps.
    cfg["history"][7]["created_by"] = cfg["history"][7]["created_by"].replace(
        "heavy-torch.txt", "heavy-cuda.txt")
    got, why = donor(cfg, m, texts={"heavy": HEAVY_TEXT, "heavy-torch": torch_text},
                     layers=layers)
    assert (got, why) == (None, "its heavy steps are not this build's (heavy-torch)")


def test_a_file_is_read_from_a_zstd_layer_too(held):
    import zstandard

    repo = splice.registry.Repository.parse("127.0.0.1:5000/acme")
    held["blobs"]["sha256:z"] = zstandard.ZstdCompressor().compress(tar_of(PATH, "in zstd\n"))
    assert splice._file_in_layer(repo, {"mediaType": ZSTD.media_type, "digest": "sha256:z"},
                                 PATH) == b"in zstd\n"


def test_steps_that_are_not_one_block_are_said_so():
    # A step that makes a layer between the two heavy parts' steps.
    cfg = _two_parts()
    cfg["history"].insert(6, {"created_by": "RUN echo between # buildkit"})
    cfg["rootfs"]["diff_ids"].insert(4, "sha256:" + "9" * 64)
    torch_text = "torch==2.13.0 --hash=sha256:" + "cd" * 32 + "\n"
    assert donor(cfg, texts={"heavy": HEAVY_TEXT, "heavy-torch": torch_text}) == \
        (None, "its heavy steps are not one block")
    # A step that makes no layer between a part's COPY and its RUN.
    cfg = recorded()
    cfg["history"].insert(5, {"created_by": "ENV X=1", "empty_layer": True})
    assert donor(cfg) == (None, "its heavy steps are not one block")


def test_a_copy_step_without_a_command_or_a_lock_part_that_is_not_text_is_no_donor():
    cfg = recorded()
    del cfg["history"][4]["created_by"]
    assert donor(cfg) == (None, "its heavy steps are not this build's (heavy)")
    layers = Layers()
    layers.blobs[f"sha256:{2:064x}"] = tar_of(PATH, "x")
    layers.blobs[f"sha256:{2:064x}"] = layers.blobs[f"sha256:{2:064x}"].replace(
        b"x" + b"\0" * 10, b"\xff" + b"\0" * 10, 1)
    assert layers(manifest_of(recorded())["layers"][2], PATH) == b"\xff"
    assert donor(layers=layers) == (None, "its heavy lock part is not this build's")


def test_a_top_without_a_rest_install_is_said_so():
    d, _ = donor()
    full = recorded()
    created_by = [h.get("created_by", "") for h in full["history"]]
    ids = full["rootfs"]["diff_ids"]
    assert splice.check_top(d, created_by[:d.before] + ["RUN echo # buildkit"], ids) == \
        "the top has no rest install step"


def test_a_split_heavy_plan_reads_each_heavy_lock_part():
    from types import SimpleNamespace

    class Lock:
        def requirements_text(self, heavy=None, layer=None):
            return f"heavy={heavy} layer={layer}"

    split, one = SimpleNamespace(split_heavy=True), SimpleNamespace(split_heavy=False)
    assert splice.heavy_parts(split) == splice.HEAVY_LAYERS
    assert splice.heavy_parts(one) == ("heavy",)
    assert splice.heavy_texts(split, Lock()) == {p: f"heavy=None layer={p}"
                                                 for p in splice.HEAVY_LAYERS}
    assert splice.heavy_texts(one, Lock()) == {"heavy": "heavy=True layer=None"}


def test_a_config_made_here_is_written_as_buildkit_writes_one():
    """Compact and with sorted keys: the bytes whose digest the manifest names."""
    cfg = {"rootfs": {"diff_ids": ["a"]}, "history": [{"n": 0}], "b": 1}
    rest = splice.CutLayer(history_at=1, layer_at=1, history={"n": 1}, diff_id="r",
                           descriptor={}, tar_size=0)
    assert splice.with_rest(json.dumps(cfg).encode(), rest) == \
        b'{"b":1,"history":[{"n":0},{"n":1}],"rootfs":{"diff_ids":["a","r"]}}'
    d, _ = donor()
    got = splice.spliced_config(d, json.dumps(recorded()).encode())
    assert got == json.dumps(json.loads(got), separators=(",", ":"), sort_keys=True).encode()
