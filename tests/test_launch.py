"""The serving container as data (images/checks/launch.yaml, catalog/launch.py) and as
`docker run` / compose / Kubernetes (plan/launch.py), on real Plans of the checkout's targets.

No Docker here: the lead's docker test runs the tiny-cpu dry-run line. The compose file is
checked against the Compose Specification schema check-jsonschema vendors, the manifests
against the Kubernetes schemas kubernetes-validate ships (offline); a LeaderWorkerSet is a CRD
those schemas do not know, so its two pod templates are validated as Pods."""

from __future__ import annotations

import dataclasses
import math
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from imgbuild.catalog.launch import LAUNCH_FILES, load_launch
from imgbuild.errors import InputError, SpecError
from imgbuild.plan import render
from imgbuild.plan.decide import make_plan
from imgbuild.plan.launch import Launch, emit_compose, emit_k8s, k8s_docs, launch_for

from .conftest import ROOT

K8S_VERSION = "1.37.0"  # the newest schema set kubernetes-validate 1.37 ships
DIGEST = "sha256:" + "ab" * 32
LAUNCH_YAML = ROOT / "images" / LAUNCH_FILES[0]


@pytest.fixture(scope="module")
def table(ws):
    return load_launch([layer.images for layer in ws.layers])


@pytest.fixture(scope="module")
def plans(ws):
    return {t: make_plan(ws, t, model=m, resolve=False)
            for t, m in (("sglang-blackwell", "k2.6"), ("vllm-blackwell", "k2.6"),
                         ("tiny-cpu", None))}


def _launch(ws, table, plans, target: str, **kw) -> Launch:
    plan = plans[target]
    return launch_for(plan, ws.model(plan.model) if plan.model else None, table, **kw)


def _after(args: list[str], flag: str) -> list[str]:
    """Every value given to `flag` in an argv."""
    return [args[i + 1] for i, a in enumerate(args[:-1]) if a == flag]


# --- docker run ----------------------------------------------------------------------------

def test_sglang_k26_docker_run(ws, table, plans, tmp_path):
    cache = tmp_path / "hf"
    launch = _launch(ws, table, plans, "sglang-blackwell", model_cache=cache)
    plan = plans["sglang-blackwell"]
    args = launch.docker_args()
    assert args[:3] == ["docker", "run", "--rm"] and "-d" not in args
    # The image, then the engine's command line with the model's flags (images/models/k2.6.yaml).
    i = args.index(plan.ref())
    assert args[i + 1:] == ["python3", "-m", "sglang.launch_server",
                            "--model-path", "moonshotai/Kimi-K2.6", "--host", "0.0.0.0",
                            "--port", "30000", "--trust-remote-code", "--tp", "8",
                            "--tool-call-parser", "kimi_k2", "--reasoning-parser", "kimi_k2"]
    assert list(launch.command) == args[i + 1:]
    opts = args[:i]
    assert _after(opts, "--gpus") == ["all"]
    assert _after(opts, "--ipc") == ["host"]
    assert "--shm-size" not in opts  # ignored by Docker beside --ipc host
    assert _after(opts, "--ulimit") == ["memlock=-1", "stack=67108864"]
    assert _after(opts, "-p") == ["30000:30000"]
    assert _after(opts, "-v") == [f"{cache}:/cache/huggingface:rw"]
    assert _after(opts, "-e") == ["HF_HOME=/cache/huggingface", "HF_TOKEN",
                                  "HF_HUB_OFFLINE"]
    assert _after(opts, "--name") == ["imgbuild-k2.6"]
    assert (launch.port, launch.host_port, launch.health_path, launch.models_path) == \
        (30000, 30000, "/health", "/v1/models")
    assert launch.tensor_parallel == 8 and launch.model_source == "hub"
    assert [p for p, _ in launch.phases] == ["loading", "loaded", "graphs", "ready"]


def test_vllm_k26_docker_run(ws, table, plans):
    launch = _launch(ws, table, plans, "vllm-blackwell", host_port=18000, name="my-vllm")
    args = launch.docker_args(detach=True, rm=False)
    assert args[:3] == ["docker", "run", "-d"] and "--rm" not in args
    i = args.index(plans["vllm-blackwell"].ref())
    assert args[i + 1:i + 8] == ["vllm", "serve", "moonshotai/Kimi-K2.6", "--host", "0.0.0.0",
                                 "--port", "8000"]
    assert "--tensor-parallel-size" in args[i:] and _after(args[i:], "--tensor-parallel-size") \
        == ["8"]
    assert _after(args[:i], "-p") == ["18000:8000"]
    assert _after(args[:i], "--name") == ["my-vllm"]
    # The default cache is the user's, expanded: docker does not expand ~.
    assert _after(args[:i], "-v") == [f"{Path.home()}/.cache/huggingface:"
                                      "/cache/huggingface:rw"]


def test_tiny_cpu_serves_its_smoke_model_without_gpus(ws, table, plans):
    launch = _launch(ws, table, plans, "tiny-cpu")
    args = launch.docker_args()
    # The CPU image gets no GPU, no host IPC and no ulimits: memlock=-1 is refused by a dockerd
    # without CAP_SYS_RESOURCE, such as this machine's (measured).
    for flag in ("--gpus", "--ipc", "--ulimit", "--shm-size", "-v"):
        assert flag not in args, flag
    assert launch.gpus is None
    # The smoke model is where the Dockerfile puts it.
    assert f"COPY smoke/model {launch.model}\n" in render.dockerfile(plans["tiny-cpu"])
    assert launch.model == f"{render.ASSETS}/smoke-model" and launch.model_source == "smoke"
    i = args.index(plans["tiny-cpu"].ref())
    assert args[i + 1:] == ["python3", "/opt/imgbuild/serve.py", "--model",
                            "/opt/imgbuild/smoke-model", "--port", "8000"]
    assert dict(launch.phases) == {"loading": "^serve: loading weights",
                                   "loaded": "^serve: weights loaded", "ready": "^serve: ready"}


def test_dry_run_line_round_trips_through_the_shell(ws, table, plans, tmp_path):
    odd = tmp_path / "my models" / "it's k2"
    profile = dataclasses.replace(ws.model("k2.6"), checkpoint=str(odd))
    plan = plans["sglang-blackwell"]
    launches = [_launch(ws, table, plans, t) for t in plans] + [
        launch_for(plan, profile, table, name="odd.name_1")]
    for launch in launches:
        for kw in ({}, {"detach": True, "rm": False}):
            assert shlex.split(launch.dry_run_line(**kw)) == launch.docker_args(**kw)
    odd_line = launches[-1].dry_run_line()
    assert shlex.split(odd_line)[shlex.split(odd_line).index("-v") + 1] == \
        f"{odd}:/models/k2.6:ro"


def test_local_checkpoint_is_mounted_read_only_under_models(ws, table, plans, tmp_path):
    plan = plans["sglang-blackwell"]
    rel = dataclasses.replace(ws.model("k2.6"), checkpoint="./ckpt/k2")
    launch = launch_for(plan, rel, table, project_root=tmp_path)
    assert launch.volumes == ((str(tmp_path / "ckpt" / "k2"), "/models/k2.6", "ro"),)
    assert launch.model == "/models/k2.6" and launch.model_source == "local"
    assert launch.command[launch.command.index("--model-path") + 1] == "/models/k2.6"
    assert "HF_HOME" not in dict(launch.env)


def test_a_name_docker_would_refuse_is_refused_here(ws, table, plans):
    with pytest.raises(InputError, match="container name"):
        _launch(ws, table, plans, "tiny-cpu", name="o'brien")


def test_hub_revision_is_passed_to_the_engine(ws, table, plans):
    prof = dataclasses.replace(ws.model("k2.6"), revision="v1.1")
    launch = launch_for(plans["vllm-blackwell"], prof, table)
    assert _after(list(launch.command), "--revision") == ["v1.1"]


def test_models_the_image_cannot_serve_are_refused(ws, table, plans):
    gen = dataclasses.replace(ws.model("tiny-nvfp4"), alias="other-gen")
    with pytest.raises(InputError) as e:
        launch_for(plans["sglang-blackwell"], gen, table)
    assert "generated" in e.value.message and "tiny-nvfp4" in e.value.message
    # The transformers server takes a hub repo id too (payload/serve.py), through the cache.
    hub = launch_for(plans["tiny-cpu"], ws.model("k2.6"), table)
    assert hub.model_source == "hub" and hub.command[3] == "moonshotai/Kimi-K2.6"


def test_phase_regexes_match_the_engines_log_lines(table):
    # The lines as the engines print them (format strings cited in images/checks/launch.yaml,
    # filled in as a run would).
    lines = {
        "sglang": {
            "loading": "[2026-01-01 10:00:00 TP0] Load weight begin. avail mem=93.10 GB",
            "loaded": "[2026-01-01 10:09:00 TP0] Load weight end. elapsed=540.2 s, "
                      "type=DeepseekV3ForCausalLM, avail mem=20.01 GB, mem usage=73.09 GB.",
            "graphs": "[2026-01-01 10:09:05 TP0] Capture target decode CUDA graph begin. "
                      "backend=full, num_tokens_per_req=1, avail mem=19.80 GB",
            "ready": "[2026-01-01 10:10:00] The server is fired up and ready to roll!"},
        "vllm": {
            "loading": "(Worker_TP0 pid=81) INFO 01-01 10:00:00 [gpu_model_runner.py:4979] "
                       "Starting to load model moonshotai/Kimi-K2.6...",
            "loaded": "(Worker_TP0 pid=81) INFO 01-01 10:09:00 [default_loader.py:507] "
                      "Loading weights took 530.12 seconds",
            "graphs": "Capturing CUDA graphs (decode, FULL): 100%|##########| 67/67",
            "ready": "(APIServer pid=1) INFO:     Application startup complete."},
        "transformers": {
            "loading": "serve: loading weights from /opt/imgbuild/smoke-model",
            "loaded": "serve: weights loaded in 0.41 s",
            "ready": "serve: ready on port 8000 (smoke-model)"},
    }
    # Lines that must mark no phase: vLLM's debug line before the weights load
    # (model_loader/base_loader.py:87), SGLang's capture failure (decode_cuda_graph_runner.py:603).
    not_phases = {
        "vllm": ["DEBUG 01-01 10:00:01 [base_loader.py:87] Loading weights on cuda ..."],
        "sglang": ["Exception: Capture cuda graph failed: CUDA out of memory"],
        "transformers": ["serve: 127.0.0.1 - GET /health HTTP/1.1 200"],
    }
    for engine, want in lines.items():
        phases = dict(table.engine(engine).phases)
        assert set(phases) == set(want), engine
        for phase, line in want.items():
            assert re.search(phases[phase], line), (engine, phase)
            others = [p for p in phases if p != phase]
            assert not any(re.search(phases[o], line) for o in others), (engine, phase)
        for line in not_phases[engine]:
            assert not any(re.search(rx, line) for rx in phases.values()), (engine, line)


# --- compose -------------------------------------------------------------------------------

def _check_jsonschema() -> list[str] | None:
    try:
        import check_jsonschema  # noqa: F401

        return [sys.executable, "-m", "check_jsonschema"]
    except ImportError:
        exe = shutil.which("check-jsonschema")
        return [exe] if exe else None


def test_compose_file_has_the_pieces_and_validates(ws, table, plans, tmp_path):
    launch = _launch(ws, table, plans, "sglang-blackwell", model_cache=tmp_path / "hf",
                     digest=DIGEST)
    (path,) = emit_compose(launch, tmp_path / "out")
    assert path == tmp_path / "out" / "compose.yaml"
    doc = yaml.safe_load(path.read_text())
    (svc,) = doc["services"].values()
    assert svc["image"] == f"{plans['sglang-blackwell'].ref()}@{DIGEST}"
    assert svc["command"] == list(launch.command)
    assert svc["ipc"] == "host" and "shm_size" not in svc
    assert svc["ulimits"] == {"memlock": -1, "stack": 67108864}
    assert svc["ports"] == ["30000:30000"]
    assert svc["volumes"] == [f"{tmp_path / 'hf'}:/cache/huggingface:rw"]
    assert svc["environment"] == ["HF_HOME=/cache/huggingface", "HF_TOKEN",
                                  "HF_HUB_OFFLINE"]
    assert svc["deploy"]["resources"]["reservations"]["devices"] == [
        {"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]
    hc = svc["healthcheck"]
    assert hc["test"][:3] == ["CMD", "python3", "-c"]
    assert "http://127.0.0.1:30000/health" in hc["test"][3]
    assert int(hc["start_period"].rstrip("s")) >= 1800
    # The health command is real Python that fails on a closed port (exit code is the verdict).
    probe = subprocess.run([sys.executable, "-c", hc["test"][3].replace(":30000", ":9")],
                           capture_output=True)
    assert probe.returncode != 0

    cpu = yaml.safe_load(emit_compose(_launch(ws, table, plans, "tiny-cpu"),
                                      tmp_path / "cpu")[0].read_text())
    (csvc,) = cpu["services"].values()
    assert "deploy" not in csvc and "ipc" not in csvc and "ulimits" not in csvc
    assert ":" in csvc["image"] and "@" not in csvc["image"]  # no digest given: by tag

    cmd = _check_jsonschema()
    if cmd is None:
        pytest.skip("check-jsonschema is not installed (dev group in pyproject.toml)")
    for f in (path, tmp_path / "cpu" / "compose.yaml"):
        r = subprocess.run([*cmd, "--builtin-schema", "vendor.compose-spec", str(f)],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text(path.read_text().replace("start_period:", "start_periodd:"))
    assert subprocess.run([*cmd, "--builtin-schema", "vendor.compose-spec", str(bad)],
                          capture_output=True).returncode == 1


# --- Kubernetes ----------------------------------------------------------------------------

def _kv():
    return pytest.importorskip(
        "kubernetes_validate",
        reason="kubernetes-validate (dev dependency) validates the manifests offline")


def _validate(kv, doc: dict) -> None:
    kv.validate(doc, K8S_VERSION, strict=True)


def _as_pod(template: dict) -> dict:
    """An LWS pod template as the Pod the LWS controller makes of it."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "lws-pod", **template["metadata"]}, "spec": template["spec"]}


QUANTITY = re.compile(r"^[0-9]+(Ki|Mi|Gi|Ti)?$")


# The restricted Pod Security standard (kubernetes.io/docs/concepts/security/
# pod-security-standards/#restricted), field by field, for a pod spec.
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                      "persistentVolumeClaim", "projected", "secret"}


def restricted(pod: dict) -> None:
    psc = pod.get("securityContext", {})
    assert not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC")
    for v in pod.get("volumes", []):
        kinds = set(v) - {"name"}
        assert kinds <= RESTRICTED_VOLUMES, v  # no hostPath
    assert psc.get("seccompProfile", {}).get("type") in ("RuntimeDefault", "Localhost")
    assert psc.get("runAsUser", 1) != 0
    for c in pod["containers"] + pod.get("initContainers", []):
        sc = c.get("securityContext", {})
        assert sc.get("privileged") is not True
        assert sc.get("allowPrivilegeEscalation") is False, c["name"]
        assert sc.get("capabilities", {}).get("drop") == ["ALL"], c["name"]
        assert set(sc.get("capabilities", {}).get("add", [])) <= {"NET_BIND_SERVICE"}
        assert (sc.get("runAsNonRoot") or psc.get("runAsNonRoot")) is True
        assert sc.get("runAsUser", psc.get("runAsUser", 1)) != 0
        assert "hostPort" not in str(c.get("ports", ""))
        # Not in the standard, asked by the issue: a read-only root, /tmp writable.
        assert sc.get("readOnlyRootFilesystem") is True
        assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"]


def _probes_ok(container: dict, port_name: str = "http") -> None:
    for probe in ("startupProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": port_name}
    sp = container["startupProbe"]
    assert sp["failureThreshold"] * sp["periodSeconds"] >= 30 * 60  # a 600 GB model's load


def test_k8s_deployment_for_k26_on_8_gpu_nodes(ws, table, plans, tmp_path):
    kv = _kv()
    launch = _launch(ws, table, plans, "sglang-blackwell", digest=DIGEST)
    files = emit_k8s(launch, tmp_path, gpus_per_node=8)
    docs = {yaml.safe_load(f.read_text())["kind"]: yaml.safe_load(f.read_text()) for f in files}
    assert set(docs) == {"Deployment", "Service", "PersistentVolumeClaim"}
    for d in docs.values():
        _validate(kv, d)
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    restricted(pod)
    # The Hugging Face cache: a claim of the model's size and a fifth (k2.6: 600 GB), read-write.
    pvc = docs["PersistentVolumeClaim"]
    assert pvc["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert pvc["spec"]["resources"]["requests"]["storage"] == \
        f"{math.ceil(plans['sglang-blackwell'].model_size_gb * 1.2)}Gi"
    cache = next(v for v in pod["volumes"] if "persistentVolumeClaim" in v)
    assert cache["persistentVolumeClaim"] == {"claimName": pvc["metadata"]["name"],
                                              "readOnly": False}
    (c,) = pod["containers"]
    assert c["image"] == f"{plans['sglang-blackwell'].ref()}@{DIGEST}"
    assert c["args"] == list(launch.command)  # args, not command: the entrypoint's preflight runs
    assert "command" not in c
    assert c["resources"]["limits"] == {"nvidia.com/gpu": 8}
    _probes_ok(c)
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "32Gi"}
    assert QUANTITY.match(shm["emptyDir"]["sizeLimit"])
    assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]
    svc = docs["Service"]
    assert svc["spec"]["ports"][0]["port"] == 30000
    assert svc["spec"]["selector"] == docs["Deployment"]["spec"]["selector"]["matchLabels"]
    # The kubernetes-validate check is strict: a misspelt field fails it.
    broken = yaml.safe_load(files[0].read_text())
    broken["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["periodSecond"] = 1
    with pytest.raises(kv.ValidationError):
        _validate(kv, broken)


@pytest.mark.parametrize("target,multi", [
    ("sglang-blackwell", ["--nnodes", "$(LWS_GROUP_SIZE)", "--node-rank", "$(LWS_WORKER_INDEX)",
                          "--dist-init-addr", "$(LWS_LEADER_ADDRESS):20000"]),
    ("vllm-blackwell", ["--nnodes", "$(LWS_GROUP_SIZE)", "--node-rank", "$(LWS_WORKER_INDEX)",
                        "--master-addr", "$(LWS_LEADER_ADDRESS)"]),
])
def test_k8s_leaderworkerset_for_k26_on_4_gpu_nodes(ws, table, plans, tmp_path, target, multi):
    kv = _kv()
    launch = _launch(ws, table, plans, target)
    files = emit_k8s(launch, tmp_path, gpus_per_node=4)
    docs = {yaml.safe_load(f.read_text())["kind"]: yaml.safe_load(f.read_text()) for f in files}
    assert set(docs) == {"LeaderWorkerSet", "Service", "PersistentVolumeClaim"}
    lws = docs["LeaderWorkerSet"]
    assert lws["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
    tpl = lws["spec"]["leaderWorkerTemplate"]
    assert tpl["size"] == 2  # ceil(8 / 4)
    assert lws["spec"]["startupPolicy"] == "LeaderCreated"
    assert tpl["restartPolicy"] == "RecreateGroupOnPodRestart"
    leader, = tpl["leaderTemplate"]["spec"]["containers"]
    worker, = tpl["workerTemplate"]["spec"]["containers"]
    for c in (leader, worker):
        assert c["resources"]["limits"] == {"nvidia.com/gpu": 4}
        assert c["args"][:len(launch.command)] == list(launch.command)
        assert c["args"][len(launch.command):len(launch.command) + len(multi)] == multi
    assert leader["args"] == list(launch.command) + multi
    _probes_ok(leader)
    # A worker (node rank > 0) serves no HTTP in either engine: no port, no probes.
    assert "startupProbe" not in worker and "readinessProbe" not in worker
    assert "ports" not in worker
    assert worker["args"][len(launch.command) + len(multi):] == (
        ["--headless"] if target == "vllm-blackwell" else [])
    # The CRD's pod templates, validated as the Pods they become.
    for t in ("leaderTemplate", "workerTemplate"):
        _validate(kv, _as_pod(tpl[t]))
        restricted(tpl[t]["spec"])
    svc = docs["Service"]
    _validate(kv, svc)
    assert svc["metadata"]["name"] != lws["metadata"]["name"]  # LWS owns that Service name
    assert svc["spec"]["selector"] == {"leaderworkerset.sigs.k8s.io/name":
                                       lws["metadata"]["name"], "role": "leader"}
    assert tpl["leaderTemplate"]["metadata"]["labels"]["role"] == "leader"


def test_k8s_refuses_what_cannot_be_placed(ws, table, plans):
    launch = _launch(ws, table, plans, "sglang-blackwell")
    with pytest.raises(InputError, match="does not split evenly over 3 nodes"):
        k8s_docs(launch, gpus_per_node=3)
    with pytest.raises(InputError, match="no multi-node launch"):
        k8s_docs(dataclasses.replace(launch, multi_node=None), gpus_per_node=4)
    # The CPU image is one pod without GPUs, whatever the nodes have.
    cpu = k8s_docs(_launch(ws, table, plans, "tiny-cpu"), gpus_per_node=1)
    assert [d["kind"] for d in cpu] == ["Deployment", "Service"]
    (c,) = cpu[0]["spec"]["template"]["spec"]["containers"]
    assert "resources" not in c
    # Its one volume: /tmp, where the image writes (HOME, caches).
    assert cpu[0]["spec"]["template"]["spec"]["volumes"] == [{"name": "tmp", "emptyDir": {}}]
    restricted(cpu[0]["spec"]["template"]["spec"])


# --- the table -----------------------------------------------------------------------------

def _broken(tmp_path: Path, edit) -> Path:
    images = tmp_path / "images"
    (images / "checks").mkdir(parents=True)
    data = yaml.safe_load(LAUNCH_YAML.read_text())
    edit(data)
    (images / LAUNCH_FILES[0]).write_text(yaml.safe_dump(data, sort_keys=False))
    return images


@pytest.mark.parametrize("edit,key,expected", [
    (lambda d: d["engines"]["sglang"].update(helth="/health"), "engines.sglang.helth",
     "one of the known keys"),
    (lambda d: d["engines"].pop("vllm"), "engines.vllm", "a launch entry for every engine"),
    (lambda d: d["engines"]["vllm"]["command"].__setitem__(2, "{modle}"),
     "engines.vllm.command[2]", "only the fields {model}, {port}"),
    (lambda d: d["engines"]["sglang"]["phases"].pop("ready"), "engines.sglang.phases.ready",
     "the log line that says the server is ready"),
    (lambda d: d["engines"]["sglang"]["phases"].update(graphs="Capture (CUDA"),
     "engines.sglang.phases.graphs", "a valid Python regular expression"),
    (lambda d: d["engines"]["sglang"]["ulimits"].update(memlok=-1),
     "engines.sglang.ulimits.memlok", "a ulimit docker knows"),
    (lambda d: d["engines"]["sglang"].update(shm_size="32GB"), "engines.sglang.shm_size",
     "a size in Docker's units"),
    (lambda d: d["engines"]["vllm"]["multi_node"]["flags"].__setitem__(1, "2"),
     "engines.vllm.multi_node.flags", "flags that use every one of"),
    (lambda d: d["engines"]["sglang"].update(port=70000), "engines.sglang.port", "a TCP port"),
    (lambda d: d["models"].pop("smoke_model"), "models.smoke_model", "required key is missing"),
])
def test_a_bad_launch_table_names_file_and_key(tmp_path, edit, key, expected):
    images = _broken(tmp_path, edit)
    with pytest.raises(SpecError) as e:
        load_launch(images)
    assert e.value.path == "images/checks/launch.yaml"
    assert e.value.key == key
    assert expected in e.value.expected


def test_the_highest_layer_with_a_table_wins(tmp_path):
    lower = _broken(tmp_path / "low", lambda d: d["engines"]["sglang"].update(port=31000))
    upper = tmp_path / "project" / "images"
    upper.mkdir(parents=True)
    assert load_launch([lower, upper]).engine("sglang").port == 31000  # upper has none
    shutil.copytree(ROOT / "images" / "checks", upper / "checks", dirs_exist_ok=True)
    t = load_launch([lower, upper])
    assert t.engine("sglang").port == 30000  # the project's, whole
    assert t.project_root == upper.parent
    # A broken lower table does not matter once a higher layer has its own.
    (lower / LAUNCH_FILES[0]).write_text("engines: [")
    assert load_launch([lower, upper]).engine("vllm").port == 8000


def test_k8s_for_a_root_only_image_asks_for_root_and_says_it_is_not_restricted(
        ws, table, plans, tmp_path):
    kv = _kv()
    reason = "the engine writes its kernels beside its modules"
    plan = dataclasses.replace(plans["sglang-blackwell"], root_only=reason)
    launch = launch_for(plan, ws.model(plan.model), table, digest=DIGEST)
    files = emit_k8s(launch, tmp_path, gpus_per_node=8)
    deploy = next(f for f in files if f.name.endswith("-deployment.yaml"))
    doc = yaml.safe_load(deploy.read_text())
    _validate(kv, doc)
    pod = doc["spec"]["template"]["spec"]
    with pytest.raises(AssertionError):
        restricted(pod)  # it cannot meet the restricted standard, and does not pretend to
    assert pod["securityContext"]["runAsUser"] == 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = pod["containers"][0]["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is False
    text = deploy.read_text()
    assert reason in text and "baseline Pod Security standard, not restricted" in text


# --- Kubernetes: GKE, RDMA, the caches ------------------------------------------------------

def _docs(files) -> dict:
    return {yaml.safe_load(f.read_text())["kind"]: yaml.safe_load(f.read_text()) for f in files}


@pytest.mark.parametrize("target", ["sglang-blackwell", "vllm-blackwell"])
def test_k8s_for_gke_over_rdma_validates_and_says_what_the_cluster_must_run(
        ws, table, plans, tmp_path, target):
    from imgbuild.plan.launch import cluster_for, with_env

    kv = _kv()
    launch = with_env(_launch(ws, table, plans, target),
                      (("TRITON_CACHE_DIR", "/var/cache/triton"),), "--env")
    cluster = cluster_for(table, gke=True, rdma=True, nccl=(("NCCL_IB_GID_INDEX", "3"),))
    files = emit_k8s(launch, tmp_path, gpus_per_node=4, cluster=cluster)
    docs = _docs(files)
    tpl = docs["LeaderWorkerSet"]["spec"]["leaderWorkerTemplate"]
    for t in ("leaderTemplate", "workerTemplate"):
        pod = tpl[t]["spec"]
        _validate(kv, _as_pod(tpl[t]))
        c, = pod["containers"]
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env["LD_LIBRARY_PATH"] == "/usr/local/nvidia/lib64"
        assert "PATH" not in env  # a Pod's env would replace the image's PATH whole
        assert (env["NCCL_IB_HCA"], env["NCCL_IB_GID_INDEX"], env["NCCL_SOCKET_IFNAME"]) == \
            ("mlx5", "3", "eth0")
        assert c["resources"]["limits"] == {"nvidia.com/gpu": 4, "rdma/ib": 1}
        sc = c["securityContext"]
        assert sc["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
        assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
        # The cache the launch moved off /tmp has an emptyDir of its own; /tmp keeps the rest.
        assert {"name": "cache-triton-cache-dir", "mountPath": "/var/cache/triton"} in \
            c["volumeMounts"]
        assert {"name": "cache-triton-cache-dir", "emptyDir": {}} in pod["volumes"]
        with pytest.raises(AssertionError):
            restricted(pod)  # IPC_LOCK: privileged, and said so in the header
    head = files[0].read_text().split("apiVersion:")[0]
    assert "RDMA device plugin that advertises rdma/ib" in head
    assert "NVIDIA Network" in head and "privileged Pod Security standard" in head
    assert "/usr/local/nvidia/lib64" in head
    said = " ".join(line.removeprefix("# ") for line in head.splitlines())
    assert "/var/cache/triton: TRITON_CACHE_DIR" in said
    assert all(len(line) <= 100 for line in head.splitlines() if "RDMA" in line)


def test_k8s_for_gke_on_one_node_stays_restricted(ws, table, plans, tmp_path):
    from imgbuild.plan.launch import cluster_for

    kv = _kv()
    launch = _launch(ws, table, plans, "sglang-blackwell")
    docs = _docs(emit_k8s(launch, tmp_path, gpus_per_node=8, cluster=cluster_for(table, gke=True)))
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    _validate(kv, docs["Deployment"])
    restricted(pod)
    c, = pod["containers"]
    assert {"name": "LD_LIBRARY_PATH", "value": "/usr/local/nvidia/lib64"} in c["env"]
    assert [v["name"] for v in pod["volumes"] if "emptyDir" in v] == ["tmp", "dshm"]
    # RDMA is for a server that spans nodes: refused on one.
    with pytest.raises(InputError, match="--rdma: .* runs on one node"):
        k8s_docs(launch, gpus_per_node=8, cluster=cluster_for(table, rdma=True))


def test_compose_read_only_validates(ws, table, plans, tmp_path):
    from imgbuild.plan.launch import read_only

    launch = read_only(_launch(ws, table, plans, "tiny-cpu"), table.writable.tmpfs)
    (path,) = emit_compose(launch, tmp_path)
    (svc,) = yaml.safe_load(path.read_text())["services"].values()
    assert svc["read_only"] is True and svc["tmpfs"] == ["/tmp:rw,exec,nosuid,nodev"]
    cmd = _check_jsonschema()
    if cmd is None:
        pytest.skip("check-jsonschema is not installed (dev group in pyproject.toml)")
    r = subprocess.run([*cmd, "--builtin-schema", "vendor.compose-spec", str(path)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


# --- which nodes: the image's arch, or an index's archs -------------------------------------

def test_node_archs_one_is_a_selector_several_an_affinity_none_nothing():
    from imgbuild.plan.launch import node_archs

    assert node_archs(()) == {}
    assert node_archs(("linux/arm64",)) == {"nodeSelector": {"kubernetes.io/arch": "arm64"}}
    got = node_archs(("linux/arm64", "linux/amd64", "linux/arm64"))
    assert got == {"affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "kubernetes.io/arch", "operator": "In",
                                   "values": ["amd64", "arm64"]}]}]}}}}


def test_k8s_pods_go_to_nodes_of_the_images_arch_and_a_multi_platform_target_names_its_index(
        ws, tmp_path):
    """`run --emit k8s`: a one-platform image's pods only onto nodes of its arch (an amd64 image
    on a Grace node fails with "exec format error" after the pull); a multi-platform target's
    pods name its index, onto nodes of any of its archs. compose runs on this host: its own
    platform's image."""
    from imgbuild.pipeline.run import run
    from imgbuild.plan.index import make_index_plan

    kv = _kv()
    repo = "127.0.0.1:5000/acme/serving"

    def emitted(target: str, kind: str = "k8s") -> tuple[dict, str]:
        out = tmp_path / f"{target}-{kind}"
        r = run(ws, target, registry_name=repo, emit=(kind, out))
        [f] = [Path(f) for f in r.files if "deployment" in f or "compose" in f]
        return yaml.safe_load(f.read_text()), f.read_text()

    one, text = emitted("tiny-cpu")
    _validate(kv, one)
    pod = one["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"kubernetes.io/arch": "amd64"} and "affinity" not in pod
    assert "linux/amd64 only: the pods go to nodes of that arch" in text
    multi, text = emitted("tiny-cpu-multi")
    _validate(kv, multi)
    pod = multi["spec"]["template"]["spec"]
    index = make_index_plan(ws, "tiny-cpu-multi", repository=repo, resolve=False)
    assert pod["containers"][0]["image"] == index.ref()  # the multi-arch tag, not a platform's
    assert pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == ["amd64", "arm64"]
    assert "nodeSelector" not in pod
    assert f"{index.ref()} is a multi-platform index (linux/amd64, linux/arm64)" in text
    compose, _ = emitted("tiny-cpu-multi", "compose")
    [svc] = compose["services"].values()
    from imgbuild.pipeline.run import host_platform

    here = make_plan(ws, "tiny-cpu-multi", repository=repo, platform=host_platform(),
                     resolve=False)
    assert svc["image"] == here.ref()
