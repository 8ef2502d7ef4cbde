"""Decision tests for the catalog readers (imgbuild/catalog/): what a spec file may say, what each
refusal names, and the facts the tables give (base per CPU, manylinux tag, nvidia/cuda tags).
Plain data and tmp_path files only."""

from __future__ import annotations

from pathlib import Path

import pytest

from imgbuild.catalog import hardware, schema
from imgbuild.errors import InputError, SpecError

# ------------------------------------------------------------------------------------------------
# schema.Doc: the one validator
# ------------------------------------------------------------------------------------------------


def test_doc_must_be_a_mapping():
    with pytest.raises(SpecError, match=r"f.yaml: \(top level\): expected a mapping"):
        schema.Doc("f.yaml", ["a"])
    with pytest.raises(SpecError, match=r"f.yaml: os.x: expected a mapping"):
        schema.Doc("f.yaml", {"os": {"x": 3}}).sub("os.x", 3)


def test_unknown_key_is_refused_with_the_closest_known_one():
    doc = schema.Doc("f.yaml", {"plaforms": []}, "target")
    with pytest.raises(SpecError) as e:
        doc.reject_unknown({"platforms", "archs"})
    assert e.value.key == "target.plaforms" and e.value.hint == "did you mean 'platforms'?"
    with pytest.raises(SpecError) as e:
        schema.Doc("f.yaml", {"zzz": 1}).reject_unknown({"platforms"})
    assert e.value.hint == "fix f.yaml and run the command again"
    schema.Doc("f.yaml", {"archs": 1}).reject_unknown({"archs"})


def test_get_types():
    doc = schema.Doc("f.yaml", {"s": "x", "n": 3, "f": 1.5, "b": True, "none": None,
                                "ver": 3.12})
    assert doc.get("s", str) == "x"
    assert doc.get("n", float) == 3.0 and isinstance(doc.get("n", float), float)
    assert doc.get("none", str, "dflt") == "dflt" and doc.get("missing", int, 7) == 7
    with pytest.raises(SpecError, match="required key is missing"):
        doc.get("missing", str)
    with pytest.raises(SpecError, match="required key is missing"):
        doc.get("none", str)
    with pytest.raises(SpecError) as e:
        doc.get("ver", str)
    assert e.value.message == "f.yaml: ver: expected a string in quotes (YAML read a number), got 3.12"
    # A `what` that asks for quotes says so once.
    with pytest.raises(SpecError) as e:
        doc.get("ver", str, what="a Python version in quotes, e.g. '3.12'")
    assert e.value.message == ("f.yaml: ver: expected a Python version in quotes, e.g. '3.12' "
                               "(YAML read a number), got 3.12")
    with pytest.raises(SpecError, match="expected an integer"):
        doc.get("b", int)  # a bool is not an integer here
    with pytest.raises(SpecError, match="expected a number"):
        doc.get("b", float)
    assert doc.get("b", bool) is True
    with pytest.raises(SpecError, match="expected a string or an integer"):
        doc.get("f", (str, int))


def test_str_list():
    doc = schema.Doc("f.yaml", {"l": ["a", "b"], "bad": ["a", 1]})
    assert doc.str_list("l") == ("a", "b") and doc.str_list("missing") == ()
    with pytest.raises(SpecError) as e:
        doc.str_list("bad")
    assert e.value.key == "bad[1]"
    with pytest.raises(SpecError, match="required key is missing"):
        doc.str_list("missing", default=...)


def test_read_yaml_names_the_line_of_a_syntax_error(tmp_path):
    (tmp_path / "images").mkdir()
    p = tmp_path / "images" / "t.yaml"
    p.write_text("a: 1\nb: [unclosed\n")
    with pytest.raises(SpecError) as e:
        schema.read_yaml(p, tmp_path / "images")
    assert e.value.path == "images/t.yaml" and "line 3" in e.value.message
    with pytest.raises(InputError, match="cannot read"):
        schema.read_yaml(tmp_path / "images" / "none.yaml", tmp_path / "images")
    p.write_text("a: [1, 2]\n")
    assert schema.read_yaml(p, tmp_path / "images") == {"a": [1, 2]}


def test_requirement_and_unknown_and_read_table(tmp_path):
    doc = schema.Doc("f.yaml", {})
    assert schema.requirement(doc, "k", "torch==2.13.0").name == "torch"
    with pytest.raises(SpecError, match="a PEP 508 requirement"):
        schema.requirement(doc, "k", "torch===")
    e = schema.unknown("target", "tiny-cpo", ["tiny-cpu", "sglang-hopper"])
    assert e.message == "unknown target 'tiny-cpo'" and e.hint == "did you mean 'tiny-cpu'?"
    assert e.facts == ["known targets: sglang-hopper, tiny-cpu"]
    assert schema.unknown("target", "zzzzzz", ["tiny-cpu"]).hint == "see `imgbuild list`"
    with pytest.raises(InputError, match="no GPU table under"):
        schema.read_table(tmp_path, ("gpus.yaml", "hw/gpus.yaml"), "GPU table")
    (tmp_path / "hw").mkdir()
    (tmp_path / "hw" / "gpus.yaml").write_text("gpus: []\n")
    assert schema.read_table(tmp_path, ("gpus.yaml", "hw/gpus.yaml"), "GPU table").data == \
        {"gpus": []}


# ------------------------------------------------------------------------------------------------
# hardware: bases, nvidia/cuda tags, GPUs, CUDA
# ------------------------------------------------------------------------------------------------


def _base(**kw) -> hardware.Base:
    return hardware.Base(**{"key": "bookworm", "image": "imgbuild/debian:bookworm",
                            "name": "Debian 12", "glibc": "2.36", "python": "3.11", **kw})


def test_base_for_another_cpu():
    pulled = _base(image="ubuntu:24.04")
    arm = pulled.for_cpu("aarch64")
    assert arm.image == "ubuntu:24.04" and arm.cpu_arch == "aarch64"
    assert arm.platform == "linux/arm64" and pulled.platform == "linux/amd64"
    assert pulled.for_cpu("x86_64") is pulled
    made = _base(bootstrap={"suite": "bookworm", "rootfs_aarch64": "sha256:aa"})
    arm = made.for_cpu("aarch64")
    assert arm.image == "imgbuild/debian:bookworm-aarch64"
    assert arm.bootstrap["rootfs"] == "sha256:aa" and arm.cpu_arch == "aarch64"
    assert made.bootstrap.get("rootfs") is None  # the original is untouched


def test_manylinux_tag_from_glibc():
    assert _base().manylinux == "manylinux_2_36"
    assert _base(glibc="2.39").manylinux == "manylinux_2_39"


def _bases_doc(**over):
    doc = {"os": {"bookworm": {"image": "x", "name": "Debian", "glibc": "2.36",
                               "python": "3.11"},
                  "noble": {"image": "ubuntu:24.04", "name": "Ubuntu", "glibc": "2.39",
                            "python": "3.12"}},
           "cuda_images": {"repository": "nvidia/cuda", "kinds": ["cudnn-devel", "runtime"],
                           "releases": [{"cuda": "12.8", "tag_version": "12.8.1",
                                         "os": ["noble"]}]}}
    doc.update(over)
    return doc


def test_cuda_image_tag_needs_the_release_on_that_os_and_a_known_kind():
    _, images, toolchain = hardware.parse_bases(_bases_doc(), "bases.yaml")
    assert toolchain is None
    assert images.tag("12.8", "runtime", "noble") == "nvidia/cuda:12.8.1-runtime-noble"
    assert images.tag("12.8", "runtime", "bookworm") is None
    assert images.tag("12.9", "runtime", "noble") is None
    assert images.tag("12.8", "devel", "noble") is None


def test_parse_bases_refusals():
    bad = _bases_doc()
    bad["os"]["bookworm"]["glibc"] = "2.36.1"
    with pytest.raises(SpecError, match="a glibc version such as '2.36'"):
        hardware.parse_bases(bad, "bases.yaml")
    bad = _bases_doc()
    bad["os"]["bookworm"]["glibc"] = 2.36
    with pytest.raises(SpecError, match="in quotes"):
        hardware.parse_bases(bad, "bases.yaml")
    bad = _bases_doc()
    bad["cuda_images"]["releases"][0]["os"] = ["jammy"]
    with pytest.raises(SpecError) as e:
        hardware.parse_bases(bad, "bases.yaml")
    assert e.value.key == "cuda_images.releases[0].os" and "jammy" in e.value.message
    with pytest.raises(SpecError, match="unknown key 'toolchains'"):
        hardware.parse_bases(_bases_doc(toolchains={}), "bases.yaml")
    _, _, tc = hardware.parse_bases(
        _bases_doc(toolchain={"requirement": "cuda-toolkit[nvcc]", "nvcc_package": "n"}), "b")
    assert tc == hardware.Toolchain("cuda-toolkit[nvcc]", "n")


def _gpus_doc():
    return {"archs": {"sm100": {"capability": "10.0", "w4a4_nvfp4": True, "fp8": True}},
            "gpus": [{"names": ["B200"], "sm": "sm100", "generation": "Blackwell",
                      "memory_gb": 180},
                     {"names": ["GB200"], "sm": "sm100", "generation": "Blackwell",
                      "memory_gb": 186, "cpu_arch": "aarch64"}]}


def test_parse_gpus():
    gpus, archs = hardware.parse_gpus(_gpus_doc(), "gpus.yaml")
    assert gpus[0].cpu_arch == "x86_64" and gpus[1].cpu_arch == "aarch64"
    assert gpus[0].memory_gb == 180.0 and archs["sm100"].w4a4_nvfp4
    bad = _gpus_doc()
    bad["gpus"][0]["sm"] = "sm90"
    with pytest.raises(SpecError, match="an arch listed under `archs:`"):
        hardware.parse_gpus(bad, "gpus.yaml")
    bad = _gpus_doc()
    del bad["gpus"][0]["names"]
    with pytest.raises(SpecError, match="required key is missing"):
        hardware.parse_gpus(bad, "gpus.yaml")


def test_parse_cuda_versions_are_a_pep440_specifier():
    doc = {"cuda": {12.8: {"min_driver": "570.26", "adds": ["sm120"]}},
           "base_archs": ["sm90"],
           "torch": [{"versions": ">=2.11,<2.15", "pypi_cuda": "12.8", "variants": ["cu128"]}]}
    cuda, base_archs, torch = hardware.parse_cuda(doc, "cuda.yaml")
    assert list(cuda) == ["12.8"] and cuda["12.8"].adds == ("sm120",)
    assert base_archs == ("sm90",) and torch[0].variants == ("cu128",)
    doc["torch"][0]["versions"] = "2.11+"
    with pytest.raises(SpecError, match="a PEP 440 specifier"):
        hardware.parse_cuda(doc, "cuda.yaml")


def test_shipped_tables_parse(tmp_path):
    images = Path(__file__).resolve().parents[1] / "images"
    for name, fn in (("bases.yaml", hardware.parse_bases), ("gpus.yaml", hardware.parse_gpus),
                     ("cuda.yaml", hardware.parse_cuda)):
        fn(schema.read_yaml(images / name, images), name)


@pytest.mark.parametrize("body, said", [
    ("checkpoint: '  '\nsize_gb: 1\n",
     "checkpoint: expected a Hugging Face repo id (org/name), a local path or generated:NAME, "
     "got '  '"),
    ("checkpoint: generated:x\nname: x\nsize_gb: 1\nrevision: main\n",
     "revision: expected no revision: it is a Hugging Face repo's branch, tag or commit, and "
     "the checkpoint is generated, got 'main'"),
    ("checkpoint: ./models/x\nsize_gb: 1\nrevision: main\n",
     "revision: expected no revision: it is a Hugging Face repo's branch, tag or commit, and "
     "the checkpoint is a local path, got 'main'"),
    ("checkpoint: org/m\nsize_gb: 1\ntensor_parallel: 0\n",
     "tensor_parallel: expected an integer >= 1, got 0"),
    ("checkpoint: org/m\nsize_gb: 0\n", "size_gb: expected a positive size in GB, got 0.0"),
    ("checkpoint: org/m\nsize_gb: 1\nengine_flags: {tgi: [--x]}\n",
     "engine_flags.tgi: expected an engine name: sglang, vllm, transformers, got 'tgi'"),
    ("checkpoint: generated:m\nname: m\nsize_gb: 1\n",
     "generator.scheme: expected the scheme the generator quantizes with, e.g. NVFP4 (a "
     "generated: checkpoint is made here, not downloaded)"),
    ("checkpoint: org/m\nsize_gb: 1\nquantization: {method: x, bits: 4}\n",
     "quantization.bits: expected one of the known keys: activations, formats, method, summary, "
     "got \"unknown key 'bits'\""),
])
def test_a_bad_model_profile_word_for_word(body, said):
    import yaml

    from imgbuild.catalog.models import parse_model

    with pytest.raises(SpecError) as e:
        parse_model("m", yaml.safe_load(body), "images/models/m.yaml")
    assert e.value.message == f"images/models/m.yaml: {said}"


def test_what_a_model_profile_leaves_out_takes_its_default():
    import yaml

    from imgbuild.catalog.models import parse_model

    hub = parse_model("m", yaml.safe_load("checkpoint: org/My-Model-NVFP4/\nsize_gb: 2\n"),
                      "images/models/m.yaml")
    assert (hub.name, hub.tensor_parallel, hub.quant_from_checkpoint) == ("My-Model-NVFP4", 1, True)
    assert (hub.generator_image, hub.generator_seed, hub.generator_scheme) == (
        "smoke-model", 0, None)
    assert (hub.engine_flags, hub.quant_formats, hub.quant_summary) == ({}, (), "")
    gen = parse_model("g", yaml.safe_load(
        "checkpoint: generated:g\nname: g\nsize_gb: 0.002\n"
        "quantization: {method: compressed-tensors, formats: [nvfp4-pack-quantized]}\n"
        "generator: {scheme: NVFP4, seed: 7, image: my-gen}\n"
        "engine_flags: {sglang: [--x, '1']}\n"), "images/models/g.yaml")
    assert (gen.quant_from_checkpoint, gen.quant_method, gen.quant_formats) == (
        False, "compressed-tensors", ("nvfp4-pack-quantized",))
    assert (gen.generator_scheme, gen.generator_seed, gen.generator_image) == ("NVFP4", 7,
                                                                               "my-gen")
    assert gen.engine_flags == {"sglang": ("--x", "1")}


def test_kernel_rules_are_read_with_their_defaults_and_a_bad_arch_refused(tmp_path):
    from imgbuild.catalog.kernels import KERNELS_FILE, load_kernel_rules

    images = tmp_path / "images"

    (images / KERNELS_FILE).parent.mkdir(parents=True, exist_ok=True)
    (images / KERNELS_FILE).write_text(
        "engines:\n  sglang:\n    required:\n      - {package: flashinfer-cubin, files: [x.so]}\n"
        "    shown:\n      - {package: sgl-kernel, archs: [sm100], why: fp4 gemm}\n"
        "  vllm: {}\n")
    got = load_kernel_rules(images)
    req, shown = got["sglang"].rules
    assert (req.package, req.files, req.archs, req.why, req.required) == (
        "flashinfer-cubin", ("x.so",), (), "", True)
    assert (shown.package, shown.archs, shown.why, shown.required) == (
        "sgl-kernel", ("sm100",), "fp4 gemm", False)
    assert got["vllm"].rules == () and got["vllm"].jit == ()
    (images / KERNELS_FILE).write_text(
        "engines:\n  sglang:\n    required:\n      - {package: p, archs: [sm100, smXX]}\n")
    with pytest.raises(SpecError) as e:
        load_kernel_rules(images)
    assert e.value.message == (f"images/{KERNELS_FILE}: engines.sglang.required[0].archs: expected "
                               "archs such as sm100, got 'smXX'")
    assert load_kernel_rules(tmp_path / "none") == {}


def _engines(tmp_path, text: str):
    from imgbuild.catalog.engines import load_engines

    (tmp_path / "images" / "checks").mkdir(parents=True, exist_ok=True)
    (tmp_path / "images" / "checks" / "engines.yaml").write_text(text)
    return load_engines(tmp_path / "images")


RULE = "{versions: '>=0.5', value: %s, checked: ['0.5.23'], evidence: [a.py:1]}"


@pytest.mark.parametrize("body, said", [
    ("engines:\n  sglang:\n    ignore_matcher: [" + RULE % "regex" + "]\n",
     "engines.sglang.ignore_matcher[0].value: expected one of substring, suffix, exact, got "
     "'regex'"),
    ("engines:\n  sglang:\n    ignore_matcher: [{versions: '>=0.5', value: exact, patch: "
     "{id: p, value: glob}}]\n",
     "engines.sglang.ignore_matcher[0].patch.value: expected one of substring, suffix, exact, "
     "got 'glob'"),
    ("engines:\n  sglang:\n    w4a4_without_fp4_arch: [{versions: '>=0.5', linear: crashes, "
     "moe: refuses}]\n",
     "engines.sglang.w4a4_without_fp4_arch[0].linear: expected one of refuses, falls-back, got "
     "'crashes'"),
    ("engines:\n  sglang:\n    fused_lookup: first\n",
     "engines.sglang.fused_lookup: expected one of shards-unless-listed, direct-first, got "
     "'first'"),
    ("engines:\n  sglang:\n    ignore_matcher: [{versions: '=>0.5', value: exact}]\n",
     "engines.sglang.ignore_matcher[0].versions: expected a PEP 440 specifier such as "
     "'>=0.5.7,<0.5.17', got '=>0.5'"),
])
def test_a_bad_engine_behaviour_word_for_word(tmp_path, body, said):
    with pytest.raises(SpecError) as e:
        _engines(tmp_path, body)
    assert e.value.message == f"images/checks/engines.yaml: {said}"


def test_engine_behaviours_are_read_with_their_defaults(tmp_path):
    t = _engines(tmp_path, (
        "fused_projections: {qkv_proj: [q_proj, k_proj, v_proj]}\n"
        "engines:\n  sglang:\n    ignore_matcher: [" + RULE % "suffix" + "]\n"
        "    model_classes:\n      versions: '>=0.5'\n      checked: ['0.5.23']\n"
        "      classes:\n        Qwen3ForCausalLM: {mapping: {qkv_proj: [q_proj]}, "
        "evidence: qwen3.py:1}\n        Bare: {}\n"
        "  vllm:\n    fuses_projections: false\n    fused_lookup: direct-first\n"))
    assert t.fused == {"qkv_proj": ("q_proj", "k_proj", "v_proj")}
    s, v = t.engines["sglang"], t.engines["vllm"]
    [r] = s.rules["ignore_matcher"]
    assert (r.versions, r.value, r.checked, r.evidence, r.patch) == (
        ">=0.5", "suffix", ("0.5.23",), ("a.py:1",), None)
    assert s.rules["activation_gate"] == () and s.rules["w4a4_without_fp4_arch"] == ()
    assert (s.fused_lookup, s.fuses_projections, s.classes_versions, s.classes_checked) == (
        "shards-unless-listed", True, ">=0.5", ("0.5.23",))
    q = s.classes["Qwen3ForCausalLM"]
    assert (q.name, q.mapping, q.evidence) == ("Qwen3ForCausalLM", {"qkv_proj": ("q_proj",)},
                                               "qwen3.py:1")
    assert (s.classes["Bare"].mapping, s.classes["Bare"].evidence) == ({}, "")
    assert (v.fused_lookup, v.fuses_projections, v.classes_versions, v.classes_checked,
            v.classes) == ("direct-first", False, None, (), {})


@pytest.mark.parametrize("change, said", [
    ({"command": []}, "command: expected the server's argv (a non-empty list), got []"),
    ({"command": ["python3", "serve.py"]},
     "command: expected a command that names {model} (what the server loads), got ['python3', "
     "'serve.py']"),
    ({"port": 65536}, "port: expected a TCP port, 1-65535, got 65536"),
    ({"ready": ["health"]}, "ready[0]: expected an absolute path, got 'health'"),
    ({"shm_size": "lots", "ipc_host": False},
     "shm_size: expected a size in Docker's units, e.g. 32g (b, k, m, g: binary), got 'lots'"),
    ({"env": {"1BAD": "x"}}, "env.1BAD: expected an environment variable name, got '1BAD'"),
    ({"env": {"GOOD": 3}}, "env.GOOD: expected a string in quotes (YAML read a number), got 3"),
    ({"env": {"GOOD": ["a"]}}, "env.GOOD: expected a string in quotes, got ['a']"),
    ({"pass_env": ["BAD NAME"]},
     "pass_env[0]: expected an environment variable name, got 'BAD NAME'"),
    ({"startup_timeout_s": 0}, "startup_timeout_s: expected a positive number of seconds, got 0"),
    ({"revision_flag": "revision"},
     "revision_flag: expected a flag such as --revision, got 'revision'"),
])
def test_a_bad_launch_entry_word_for_word(tmp_path, change, said):
    import copy

    import yaml

    from imgbuild.catalog.launch import load_launch

    from .conftest import ROOT

    doc = yaml.safe_load((ROOT / "images" / "checks" / "launch.yaml").read_text())
    (tmp_path / "images" / "checks").mkdir(parents=True)
    good = copy.deepcopy(doc)
    good["engines"]["transformers"]["port"] = 65535
    (tmp_path / "images" / "checks" / "launch.yaml").write_text(yaml.safe_dump(good))
    assert load_launch(tmp_path / "images").engine("transformers").port == 65535
    doc["engines"]["transformers"].update(change)
    (tmp_path / "images" / "checks" / "launch.yaml").write_text(yaml.safe_dump(doc))
    with pytest.raises(SpecError) as e:
        load_launch(tmp_path / "images")
    assert e.value.message == f"images/checks/launch.yaml: engines.transformers.{said}"


def _launch_yaml(tmp_path, edit):
    """images/checks/launch.yaml as shipped, edited; the images/ it lies in."""
    import copy

    import yaml

    from .conftest import ROOT

    doc = copy.deepcopy(yaml.safe_load((ROOT / "images" / "checks" / "launch.yaml").read_text()))
    edit(doc)
    (tmp_path / "images" / "checks").mkdir(parents=True, exist_ok=True)
    (tmp_path / "images" / "checks" / "launch.yaml").write_text(yaml.safe_dump(doc,
                                                                               sort_keys=False))
    return tmp_path / "images"


def _tf(**change):
    return lambda d: d["engines"]["transformers"].update(change)


def _at(*path, value):
    def edit(d):
        for k in path[:-1]:
            d = d[k]
        d[path[-1]] = value
    return edit


FLAGS = ["--nnodes", "{nnodes}", "--node-rank", "{node_rank}", "--addr", "{leader}"]
ADD_TGI = _at("engines", "tgi", value={"command": ["tgi", "{model}"], "port": 1})


@pytest.mark.parametrize("edit, said", [
    (_tf(health="/health check"), "engines.transformers.health: expected an absolute path such "
     "as /health, no spaces, got '/health check'"),
    (_tf(phases={"loading": "x"}), "engines.transformers.phases.ready: expected the log line "
     "that says the server is ready (required: the other phases are optional)"),
    (_tf(phases={"ready": 3}), "engines.transformers.phases.ready: expected a regular "
     "expression (Python re) in quotes (YAML read a number), got 3"),
    (_tf(ulimits={"nofile": "lots"}), "engines.transformers.ulimits.nofile: expected an integer "
     "(-1: unlimited) or {soft: N, hard: N}, got 'lots'"),
    (_tf(ulimits={"nofile": -2}), "engines.transformers.ulimits.nofile: expected -1 (unlimited) "
     "or a value >= 0, got -2"),
    (_tf(ulimits={"nofile": {"soft": 5, "hard": 2}}), "engines.transformers.ulimits.nofile: "
     "expected soft <= hard (-1 is unlimited), got {'soft': 5, 'hard': 2}"),
    (_tf(multi_node={"flags": FLAGS[:2]}), "engines.transformers.multi_node.flags: expected "
     "flags that use every one of {leader}, {nnodes}, {node_rank}, got 'no {leader}, "
     "{node_rank}'"),
    (_tf(multi_node={"flags": FLAGS, "worker_flags": ["{oops"]}),
     "engines.transformers.multi_node.worker_flags[0]: expected a word whose braces are "
     "{field}s (write {{ for a literal brace), got \"'{oops' (expected '}' before end of "
     "string)\""),
    (_tf(command=["python3", "{model", "{model}"]), "engines.transformers.command[1]: expected a "
     "word whose braces are {field}s (write {{ for a literal brace), got \"'{model' (expected "
     "'}' before end of string)\""),
    (_at("models", "hf_cache", "env", value="BAD NAME"), "models.hf_cache.env: expected an "
     "environment variable name, got 'BAD NAME'"),
    (_at("models", "hf_cache", "host", value="relative/path"), "models.hf_cache.host: expected "
     "an absolute path or one under ~, got 'relative/path'"),
    (_at("rdma", "resource", value="bad resource"), "rdma.resource: expected an extended "
     "resource name, DOMAIN/NAME (rdma/ib), got 'bad resource'"),
    (_at("rdma", "capabilities", value=["CAP_IPC_LOCK"]), "rdma.capabilities[0]: expected a "
     "capability as Kubernetes names it, without CAP_ (IPC_LOCK), got 'CAP_IPC_LOCK'"),
    (_at("rdma", "env", value={"1BAD": "x"}), "rdma.env.1BAD: expected an environment variable "
     "name, got '1BAD'"),
    (_at("rdma", "env", value={"N": ["x"]}), "rdma.env.N: expected a string in quotes, got "
     "['x']"),
    (lambda d: d["writable"]["dirs"][1].update(env="BAD NAME"), "writable.dirs[1].env: expected "
     "an environment variable name, got 'BAD NAME'"),
    (lambda d: d["writable"]["dirs"][1].update(default=5), "writable.dirs[1].default: expected "
     "~/PATH, {VAR}/PATH or an absolute path in quotes (YAML read a number), got 5"),
    (lambda d: d["writable"]["dirs"][1].update(default="{NOPE}/x"), "writable.dirs[1].default: "
     "expected a {VAR} that an entry above names (HOME), got '{NOPE}/x'"),
    (_at("writable", "dirs", value=[{"env": "XDG_CACHE_HOME", "default": "/cache"},
                                    {"env": "HOME", "default": "~"}]),
     "writable.dirs: expected HOME first (the others default under it), got ['XDG_CACHE_HOME']"),
    (ADD_TGI, "engines.tgi: expected an engine a target can name: sglang, vllm, transformers, "
     "got 'tgi'"),
])
def test_more_of_a_bad_launch_table_word_for_word(tmp_path, edit, said):
    from imgbuild.catalog.launch import load_launch

    with pytest.raises(SpecError) as e:
        load_launch(_launch_yaml(tmp_path, edit))
    assert e.value.message == f"images/checks/launch.yaml: {said}"
    assert e.value.hint == "fix images/checks/launch.yaml and run the command again"


def test_a_launch_table_without_an_engine_or_at_all_says_how_to_go_on(tmp_path):
    from imgbuild.catalog.launch import load_launch

    with pytest.raises(SpecError) as e:
        load_launch(_launch_yaml(tmp_path, lambda d: d["engines"].pop("transformers")))
    assert (e.value.message, e.value.hint) == (
        "images/checks/launch.yaml: engines.transformers: expected a launch entry for every "
        "engine a target can name: sglang, vllm, transformers, got '(missing)'",
        "add engines.transformers to images/checks/launch.yaml (command, port, health, models, "
        "phases, gpus, startup_timeout_s)")
    with pytest.raises(InputError) as e:
        load_launch(tmp_path / "elsewhere")
    assert e.value.message == f"no launch table under {tmp_path / 'elsewhere'}"


def test_what_a_launch_entry_leaves_out_and_what_it_says_is_kept(tmp_path):
    from imgbuild.catalog.launch import load_launch

    def edit(d):
        t = d["engines"]["transformers"]
        t.pop("ipc_host")
        t["multi_node"] = {"flags": FLAGS, "worker_serves_http": True}
        d["rdma"]["env"]["EMPTY"] = None
    table = load_launch(_launch_yaml(tmp_path, edit))
    e = table.engine("transformers")
    assert (e.engine, e.ipc_host) == ("transformers", False)  # not said: not the host's IPC
    assert e.multi_node.worker_serves_http is True and e.multi_node.worker_flags == ()
    assert e.evidence and e.evidence[0].startswith("imgbuild/payload/serve.py: ")
    assert ("EMPTY", "") in table.rdma.env  # a null value is the empty string
    no_env = load_launch(_launch_yaml(tmp_path / "two", lambda d: d["gke"].pop("env")))
    assert no_env.gke_env == ()  # an env map left out is empty
    with pytest.raises(SpecError) as err:
        table.engine("tgi")
    assert err.value.message == (
        "images/checks/launch.yaml: engines.tgi: expected a launch entry for every engine a "
        "target can name: sglang, vllm, transformers, got '(missing)'")


def test_an_unknown_name_suggests_the_closest_one_half_alike_or_more():
    from imgbuild.catalog.schema import unknown

    known = ["sglang-blackwell", "sglang-hopper", "tiny-cpu", "tiny-cpu-multi", "sglang-gb200"]
    # 'gb200' is 0.59 alike 'sglang-gb200': over the half the suggestion needs
    assert unknown("target", "gb200", known).hint == "did you mean 'sglang-gb200'?"
    e = unknown("target", "zzz", known, cmd="imgbuild list --json")
    assert (e.message, e.facts, e.hint) == (
        "unknown target 'zzz'",
        ["known targets: sglang-blackwell, sglang-gb200, sglang-hopper, tiny-cpu, "
         "tiny-cpu-multi"], "see `imgbuild list --json`")


@pytest.mark.parametrize("url, host, login, password", [
    ("https://user@host/simple", "host", "user", ""),
    ("https://:s%40cret@host/simple", "host", "", "s@cret"),
    ("https://u:p@/x", "", "u", "p"),
])
def test_an_index_credential_is_what_its_url_gives_and_no_more(url, host, login, password):
    from imgbuild.catalog.indexes import credential_of

    c = credential_of(url)
    assert (c.host, c.login, c.password) == (host, login, password)
    assert credential_of("https://host/simple") is None
