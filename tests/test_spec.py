"""Spec loading and validation: every error names the file, the key and what was expected."""

from __future__ import annotations

import pytest

from imgbuild.catalog.catalog import load_catalog
from imgbuild.errors import InputError, SpecError

from .conftest import ROOT, run_imgbuild


def test_shipped_catalog_has_the_required_targets_and_models():
    cat = load_catalog(ROOT / "images")
    for t in ("sglang-blackwell", "sglang-hopper", "vllm-blackwell", "tiny-cpu"):
        assert t in cat.targets
    assert cat.target("sglang-blackwell").archs == ("sm100", "sm120")
    assert cat.target("sglang-hopper").archs == ("sm90",)
    k = cat.model("k2.6")
    assert (k.size_gb, k.tensor_parallel) == (595, 8)
    assert "--trust-remote-code" in k.engine_flags["sglang"]
    assert "kimi_k2" in k.engine_flags["sglang"]
    assert cat.model("tiny-nvfp4").generated
    assert cat.model("tiny-nvfp4").quant_formats == ("nvfp4-pack-quantized",)


def _write(images, name, text):
    (images / name).write_text(text)


def test_malformed_yaml_names_file_and_line(images_copy):
    _write(images_copy, "broken.yaml", "engine:\n  name: sglang\n  version: [0.5\n")
    with pytest.raises(SpecError) as e:
        load_catalog(images_copy)
    assert "images/broken.yaml" in str(e.value)
    assert "line" in str(e.value)


def test_unknown_key_suggests_the_closest(images_copy):
    text = (images_copy / "tiny-cpu.yaml").read_text().replace("archs:", "arches:")
    _write(images_copy, "tiny-cpu.yaml", text)
    with pytest.raises(SpecError) as e:
        load_catalog(images_copy)
    assert "images/tiny-cpu.yaml: arches" in str(e.value)
    assert e.value.hint == "did you mean 'archs'?"


@pytest.mark.parametrize("body, key, expected", [
    ("engine: {name: sglang}\narchs: [sm90]\nos: debian-bookworm\n", "engine.version", "required"),
    ("engine: {name: sglang, version: 0.5}\narchs: [sm90]\nos: debian-bookworm\n",
     "engine.version", "in quotes"),
    ("engine: {name: sglang, version: '0.5.23'}\narchs: sm90\nos: debian-bookworm\n",
     "archs", "a list"),
    ("engine: {name: sglang, version: '0.5.23'}\narchs: [hopper]\nos: debian-bookworm\n",
     "archs[0]", "sm90"),
    ("engine: {name: tgi, version: '1.0'}\narchs: [sm90]\nos: debian-bookworm\n",
     "engine.name", "one of sglang"),
    ("engine: {name: sglang, version: '0.5.23'}\narchs: [sm90]\nos: debian-bookworm\n"
     "overrides:\n  - requirement: compressed-tensors==0.18.0\n", "overrides[0].reason", "reason"),
    ("engine: {name: sglang, version: '0.5.23'}\narchs: [sm90]\nos: debian-bookworm\n"
     "requirements: ['torch>=>2']\n", "requirements[0]", "PEP 508"),
    ("engine: {name: sglang, version: '0.5.23'}\narchs: [sm90]\nos: ubuntu-99\n", "os",
     "images/bases.yaml"),
    # Running as root only needs its reason in words, not a switch.
    ("engine: {name: sglang, version: '0.5.23'}\narchs: [sm90]\nos: debian-bookworm\n"
     "smoke: {root_only: true}\n", "smoke.root_only", "written reason"),
    ("engine: {name: sglang, version: '0.5.23'}\narchs: [sm90]\nos: debian-bookworm\n"
     "smoke: {root_only: '  '}\n", "smoke.root_only", "non-empty written reason"),
])
def test_bad_target_fields(images_copy, body, key, expected):
    _write(images_copy, "bad.yaml", body)
    with pytest.raises(SpecError) as e:
        load_catalog(images_copy)
    msg = str(e.value)
    assert msg.startswith(f"images/bad.yaml: {key}:"), msg
    assert expected in msg


def test_unknown_target_and_model_list_known_and_closest():
    cat = load_catalog(ROOT / "images")
    with pytest.raises(InputError) as e:
        cat.target("sglang-blackwel")
    assert e.value.hint == "did you mean 'sglang-blackwell'?"
    assert "tiny-cpu" in e.value.facts[0]
    with pytest.raises(InputError) as e:
        cat.model("k2.5")
    assert e.value.hint == "did you mean 'k2.6'?"


def test_cli_bad_input_exit_2_without_traceback(images_copy):
    r = run_imgbuild("plan", "no-such-target")
    assert r.returncode == 2
    assert "unknown target 'no-such-target'" in r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    r = run_imgbuild("plan", "tiny-cpu", "--model", "k3")
    assert r.returncode == 2 and "unknown model 'k3'" in r.stderr
    _write(images_copy, "broken.yaml", "engine: {name: sglang\n")
    r = run_imgbuild("list", "--images", str(images_copy))
    assert r.returncode == 2
    assert "images/broken.yaml" in r.stderr and "Traceback" not in r.stderr
    r = run_imgbuild("list", "--json", "--images", str(images_copy))
    assert r.returncode == 2 and '"exit_code": 2' in r.stdout


def test_cli_list_json():
    import json

    r = run_imgbuild("list", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["targets"]["sglang-blackwell"]["engine"] == "sglang==0.5.23"
    assert doc["models"]["k2.6"]["size_gb"] == 595


def test_the_fast_yaml_loader_reads_every_shipped_file_as_pyyaml_does(tmp_path):
    """read_yaml parses with libyaml where PyYAML has it: the same values for every shipped
    file, and for a broken one the pure-Python parser's message, which names what is wrong."""
    import yaml

    from imgbuild.catalog.schema import read_yaml

    files = sorted((ROOT / "images").rglob("*.yaml"))
    assert len(files) > 15
    for f in files:
        assert read_yaml(f, ROOT / "images") == yaml.safe_load(f.read_text()), f
    broken = tmp_path / "images" / "x.yaml"
    broken.parent.mkdir()
    broken.write_text("a: &x 1\nb: *y\n")
    with pytest.raises(SpecError) as e:
        read_yaml(broken, tmp_path / "images")
    assert "found undefined alias 'y'" in str(e.value), e.value  # libyaml says not which
    assert "line 2, column 4" in str(e.value)


HEAD = "engine: {name: sglang, version: '0.5.23'}\narchs: [sm90]\nos: debian-bookworm\n"


@pytest.mark.parametrize("body, said", [
    (HEAD + "platforms: [linux/s390x]\n",
     "platforms[0]: expected an OCI platform: one of linux/amd64, linux/arm64, got 'linux/s390x'"),
    (HEAD + "platforms: [linux/amd64, linux/amd64]\n",
     "platforms: expected each platform once, got 'linux/amd64, linux/amd64'"),
    (HEAD + "platforms: []\n", "platforms: expected at least one platform, got '[]'"),
    (HEAD + "python: '3'\n", "python: expected a Python minor version such as '3.12', got '3'"),
    (HEAD + "python: 3.12\n",
     "python: expected a Python version in quotes, e.g. '3.12' (YAML read a number), got 3.12"),
    (HEAD + "overrides:\n  - requirement: compressed-tensors==0.18.0\n    reason: '  '\n",
     "overrides[0].reason: expected a non-empty written reason"),
    (HEAD + "overrides:\n  - requirement: compressed-tensors==0.18.0\n    reason: 3\n",
     "overrides[0].reason: expected a written reason (why this override is needed) in quotes "
     "(YAML read a number), got 3"),
    (HEAD + "indexes:\n  - name: x\n    url: ftp://x/simple\n    packages: [torch]\n",
     "indexes[0].url: expected an http(s) URL of a PEP 503 simple index, got 'ftp://x/simple'"),
    (HEAD + "indexes:\n  - name: x\n    url: https://x/simple\n    packages: [torch]\n"
     "    platforms: [linux/arm64]\n",
     "indexes[0].platforms[0]: expected one of the target's platforms (linux/amd64), got "
     "'linux/arm64'"),
    (HEAD + "flavor: fat\n", "flavor: expected one of devel, cuda-devel, slim, got 'fat'"),
    ("engine: {name: tgi, version: '1.0'}\narchs: [sm90]\nos: debian-bookworm\n",
     "engine.name: expected one of sglang, vllm, transformers, got 'tgi'"),
    ("engine: {name: sglang, version: 'x.y'}\narchs: [sm90]\nos: debian-bookworm\n",
     "engine.version: expected an exact PEP 440 version such as '0.5.23', got 'x.y'"),
    ("engine: {name: sglang, version: 0.5}\narchs: [sm90]\nos: debian-bookworm\n",
     "engine.version: expected an exact version in quotes, e.g. '0.5.23' (YAML read a number), "
     "got 0.5"),
    ("engine: sglang\narchs: [sm90]\nos: debian-bookworm\n",
     "engine: expected a mapping with name and version, got 'sglang'"),
    ("engine: {name: sglang, version: '0.5.23'}\narchs: [hopper]\nos: debian-bookworm\n",
     "archs[0]: expected a CUDA arch such as sm90, sm100, sm120 (or cpu), got 'hopper'"),
])
def test_a_bad_target_field_word_for_word(images_copy, body, said):
    _write(images_copy, "bad.yaml", body)
    with pytest.raises(SpecError) as e:
        load_catalog(images_copy)
    assert (e.value.message, e.value.hint) == (
        f"images/bad.yaml: {said}", "fix images/bad.yaml and run the command again")


def test_what_a_target_leaves_out_takes_its_default(images_copy):
    _write(images_copy, "cpu.yaml", "engine: {name: transformers, version: '5.17.0'}\n"
                                    "archs: [cpu]\nos: debian-bookworm\n"
                                    "overrides:\n  - requirement: numpy==2.0.0\n"
                                    "    reason: a pin of ours\n    link: https://x/issue/1\n")
    _write(images_copy, "gpu.yaml", HEAD)
    cat = load_catalog(images_copy)
    cpu, gpu = cat.target("cpu"), cat.target("gpu")
    assert (cpu.flavor, gpu.flavor) == ("slim", "devel")
    assert (cpu.build_from_source, cpu.platforms) == (False, ("linux/amd64",))
    [ov] = cpu.overrides
    assert (ov.requirement, ov.reason, ov.link) == ("numpy==2.0.0", "a pin of ours",
                                                    "https://x/issue/1")
