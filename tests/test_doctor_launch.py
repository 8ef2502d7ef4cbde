"""doctor knows the failures a person meets first when a server's container starts (issue 28).

No GPU in the container, a /dev/shm too small, an image without kernels for the host's GPU, a
model that is neither in the mounted cache nor downloadable: each is named with its catalog id,
the engine that wrote the log, and a fix that says the way out (the docker flags, and the
`imgbuild` command that does it). The logs are tests/fixtures/logs' and the corpus's (their
READMEs say where each text comes from); the Hugging Face texts are also produced here, by the
installed huggingface_hub and transformers run offline.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from imgbuild.catalog.failures import load_failures
from imgbuild.checks import doctor

from .conftest import ROOT

FAILURES = load_failures(ROOT / "images")
LOGS = ROOT / "tests" / "fixtures" / "logs"
CORPUS = ROOT / "tests" / "fixtures" / "corpus"
NO_ACCEL = ("RuntimeError: No accelerator (CUDA, XPU, HPU, NPU, MUSA, MPS) or platform plugin "
            "is available.")


def run(text: str) -> tuple[list[doctor.Diagnosis], doctor.LogEngine | None]:
    found: list = []
    diags = doctor.diagnose(text, FAILURES, found)
    return diags, found[0]


def read(path) -> str:
    return doctor.read_log(str(path))[0]


# --- no GPU visible ------------------------------------------------------------------------------

def test_sglang_0523_without_a_gpu_is_no_gpu_visible():
    # The traceback SGLang 0.5.23 prints with no GPU, its RuntimeError the last line.
    text = read(LOGS / "no-gpu-visible.log")
    assert text.rstrip().splitlines()[-1] == NO_ACCEL
    diags, engine = run(text)
    assert [d.id for d in diags] == ["no-gpu-visible"]
    d = diags[0]
    assert (engine.name, engine.certain) == ("sglang", True)
    assert d.certain and d.severity == "error"
    assert d.evidence[0].text == NO_ACCEL
    assert [e.role for e in d.evidence] == ["match", "frame"]  # the get_device frame above it
    assert "SGLang found no accelerator" in d.title
    assert "SGLang chooses its device" in d.cause
    for way_out in ("docker run --gpus all", "nvidia-ctk runtime configure --runtime=docker",
                    "nvidia-smi", "imgbuild run MODEL"):
        assert way_out in d.fix, way_out
    # The exception line alone, as a one-line paste, is the same failure.
    assert [d.id for d in run(NO_ACCEL + "\n")[0]] == ["no-gpu-visible"]


def test_the_whole_no_gpu_log_is_one_answer_naming_the_engine():
    # The CUDA base image's banner and torch's warning come first; the engine's sentence, later,
    # still names the engine in the title, and is evidence.
    diags, engine = run(read(CORPUS / "synthetic-sglang-0523-no-gpu-visible.log"))
    assert [d.id for d in diags] == ["no-gpu-visible"]
    d = diags[0]
    assert engine.name == "sglang"
    assert d.severity == "error"  # the banner and torch's line are warnings; the raise is not
    assert d.occurrences == 3
    assert "SGLang found no accelerator" in d.title
    assert d.captures["nvidia_said"] == "The NVIDIA Driver was not detected"
    assert ("engine", NO_ACCEL) in [(e.role, e.text) for e in d.evidence]


def test_no_gpu_visible_outranks_another_error_earlier_in_the_log():
    # A traceback's reading (the raise's frame with the exception) is more specific than one
    # line of another failure, even one that comes first.
    text = ("RuntimeError: Failed to find C compiler. Please specify via CC environment "
            "variable.\n" + read(LOGS / "no-gpu-visible.log"))
    diags, _ = run(text)
    assert [d.id for d in diags] == ["no-gpu-visible", "triton-no-c-compiler"]


@pytest.mark.parametrize("name,line", [
    # 0.5.9 wording, and the quoted raise line above it that is not a second occurrence
    ("sglang-gpustack-5218-no-gpu-in-runner.log",
     "RuntimeError: No accelerator (CUDA, XPU, HPU, NPU, MUSA) is available."),
])
def test_older_sglang_wordings(name, line):
    diags, engine = run(read(CORPUS / name))
    assert [d.id for d in diags] == ["no-gpu-visible"]
    assert engine.name == "sglang"
    assert diags[0].evidence[0].text == line and diags[0].occurrences == 1


@pytest.mark.parametrize("name,said", [
    ("vllm-10717-infer-device-no-gpu-vps.log", "RuntimeError: Failed to infer device type"),
    ("vllm-12847-unspecified-platform.log",
     "No platform detected, vLLM is running on UnspecifiedPlatform"),
])
def test_vllm_without_a_gpu(name, said):
    diags, engine = run(read(CORPUS / name))
    assert [d.id for d in diags] == ["no-gpu-visible"]
    d = diags[0]
    assert engine.name == "vllm"
    assert said in d.evidence[0].text
    assert "vLLM detected no platform" in d.title and "vLLM detects its platform" in d.cause
    assert "docker run --gpus all" in d.fix and "imgbuild run MODEL" in d.fix


@pytest.mark.parametrize("line,said,severity", [
    ("RuntimeError: Found no NVIDIA driver on your system. Please check that you have an NVIDIA "
     "GPU and installed a driver from http://www.nvidia.com/Download/index.aspx",
     "Found no NVIDIA driver on your system", "error"),
    ("RuntimeError: No CUDA GPUs are available", "No CUDA GPUs are available", "error"),
    ("RuntimeError: CUDA driver initialization failed, you might not have a CUDA gpu.",
     "CUDA driver initialization failed, you might not have a CUDA gpu", "error"),
    # torch.cuda.is_available() only warns: the server may not have failed (yet)
    ("/usr/local/lib/python3.12/dist-packages/torch/cuda/__init__.py:188: UserWarning: CUDA "
     "initialization: Found no NVIDIA driver on your system. Please check that you have an NVIDIA "
     "GPU and installed a driver from http://www.nvidia.com/Download/index.aspx (Triggered "
     "internally at /pytorch/c10/cuda/CUDAFunctions.cpp:119.)",
     "Found no NVIDIA driver on your system", "warning"),
])
def test_torch_without_a_gpu(line, said, severity):
    diags, _ = run(line + "\n")
    assert [d.id for d in diags] == ["no-gpu-visible"]
    d = diags[0]
    assert d.severity == severity
    assert d.title.endswith(f"(torch: {said})")
    assert "--gpus all" in d.fix and "imgbuild run MODEL" in d.fix


# --- shared memory -------------------------------------------------------------------------------

def test_torch_shared_memory_full():
    diags, engine = run(read(LOGS / "shm-too-small.log"))
    assert [d.id for d in diags] == ["shm-too-small"]
    d = diags[0]
    assert engine.name == "vllm"
    # the docker flags themselves, and the command that sets them
    assert "Start the container with `--ipc=host`" in d.fix and "`--shm-size=16g`" in d.fix
    assert "imgbuild run MODEL" in d.fix
    assert "64 MB" in d.cause
    bus = ("ERROR: Unexpected bus error encountered in worker. This might be caused by "
           "insufficient shared memory (shm).\n")
    assert [x.id for x in run(bus)[0]] == ["shm-too-small"]


@pytest.mark.parametrize("line", [
    "host:1:1 [0] misc/shmutils.cc:72 NCCL WARN Error: failed to extend /dev/shm/nccl-H1dBqY to "
    "9637892 bytes",
    "gpu2-ru7:2143:2561 [1] include/shm.h:28 NCCL WARN Call to posix_fallocate failed : No space "
    "left on device",
])
def test_nccls_shared_memory_lines_say_how_to_give_it_more(line):
    diags, _ = run(line + "\n")
    assert [d.id for d in diags] == ["nccl-system-error"]
    fix = diags[0].fix
    assert "Start the container with `--ipc=host` or `--shm-size=16g`" in fix
    assert "imgbuild run MODEL" in fix


def test_nccl_segment_size_is_read_from_the_line_after_the_extend_line():
    diags, engine = run(read(CORPUS / "kserve-3791-nccl-shm-extend-ray.log"))
    assert [d.id for d in diags] == ["nccl-system-error"]
    d = diags[0]
    assert engine.name == "vllm"
    assert "failed to extend" in d.evidence[0].text
    assert dict(d.captures) == {"segment": "/dev/shm/nccl-Qw7LzA", "size": "9637888"}
    assert d.evidence[1].role == "segment"


# --- an image without kernels for the host's GPU ---------------------------------------------------

@pytest.mark.parametrize("line,fid", [
    ("RuntimeError: CUDA error: no kernel image is available for execution on the device",
     "no-kernel-image"),
    ("NVIDIA RTX PRO 6000 Blackwell Server Edition with CUDA capability sm_120 is not compatible "
     "with the current PyTorch installation.", "torch-arch-unsupported"),
])
def test_an_image_without_the_hosts_arch_names_run_and_preflight(line, fid):
    diags, _ = run(line + "\n")
    assert [d.id for d in diags] == [fid]
    assert "imgbuild run MODEL" in diags[0].fix and "imgbuild preflight IMAGE" in diags[0].fix


# --- the model neither cached nor downloadable ---------------------------------------------------

def test_sglang_offline_without_the_cache():
    diags, engine = run(read(LOGS / "hf-model-not-cached.log"))
    assert [d.id for d in diags] == ["hf-model-not-cached"]
    d = diags[0]
    assert engine.name == "sglang"
    assert d.title == ("the model is not in the server's Hugging Face cache, and the Hub is "
                       "switched off (offline mode)")
    # the model's name is taken from the server's arguments, logged before
    assert d.captures["model"] == "Qwen/Qwen3-0.6B" and d.evidence[1].role == "model"
    assert "-v ~/.cache/huggingface:/root/.cache/huggingface" in d.fix
    assert "`hf download Qwen/Qwen3-0.6B`" in d.fix
    assert "--model-path" in d.fix and "imgbuild run MODEL" in d.fix


def test_without_the_models_name_the_fix_says_model():
    line = ("OSError: We couldn't connect to 'https://huggingface.co' to load the files, and "
            "couldn't find them in the cached files.\n")
    d = run(line)[0][0]
    assert d.id == "hf-model-not-cached"
    assert "`hf download MODEL`" in d.fix and "could not be reached" in d.title
    assert "{" not in d.fix + d.cause + d.title


@pytest.mark.parametrize("name,model,hub", [
    ("vllm-1986-hub-unreachable.log", "meta-llama/Llama-2-13b-chat-hf", "could not be reached"),
    ("vllm-3719-offline-mode-enabled.log", "TheBloke/CodeLlama-7B-Python-AWQ",
     "is switched off (offline mode)"),
])
def test_vllm_hub_failures(name, model, hub):
    diags, engine = run(read(CORPUS / name))
    assert [d.id for d in diags] == ["hf-model-not-cached"]
    assert engine.name == "vllm"
    assert diags[0].captures["model"] == model and diags[0].title.endswith(hub)
    assert f"`hf download {model}`" in diags[0].fix


# What the installed huggingface_hub and transformers print offline, with an empty cache: the
# messages are theirs, not copies.
OFFLINE_RUNS = """
import sys, traceback
from huggingface_hub import hf_hub_download, snapshot_download
from transformers import AutoConfig
for call in (lambda: AutoConfig.from_pretrained("Qwen/Qwen3-0.6B"),
             lambda: snapshot_download("Qwen/Qwen3-0.6B"),
             lambda: hf_hub_download("Qwen/Qwen3-0.6B", "config.json")):
    try:
        call()
    except Exception:
        traceback.print_exc()
        print("=" * 20, file=sys.stderr)
"""


def test_what_huggingface_hub_and_transformers_print_offline(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    env |= {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "TRANSFORMERS_VERBOSITY":
            "error"}
    out = subprocess.run([sys.executable, "-c", OFFLINE_RUNS], env=env, capture_output=True,
                         text=True, timeout=300)
    runs = [r for r in out.stderr.split("=" * 20) if "Traceback" in r]
    assert len(runs) == 3, out.stderr[-3000:]
    for text in runs:
        diags, _ = run(text)
        assert [d.id for d in diags] == ["hf-model-not-cached"], text[-800:]
        assert diags[0].title.endswith("is switched off (offline mode)"), text[-800:]
    # transformers' own sentence, without huggingface_hub's above it, is known too
    said = runs[0][runs[0].index("OSError: We couldn't connect to"):]
    diags, _ = run(said)
    assert [d.id for d in diags] == ["hf-model-not-cached"]
    assert diags[0].evidence[0].text.startswith("OSError: We couldn't connect to 'https://")
