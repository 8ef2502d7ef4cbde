"""Decisions of the launch files (plan/launch.py) on hand-made Launches: which fields a
Kubernetes manifest or a compose file carries and with which values, which flags `docker run`
gets. The manifests are also validated against the Kubernetes schemas kubernetes-validate
ships (offline), as tests/test_launch.py does."""

from __future__ import annotations

import dataclasses
import math

import pytest
import yaml

from imgbuild.catalog.launch import MultiNode
from imgbuild.errors import InputError
from imgbuild.plan import launch as L
from imgbuild.plan.launch import Launch, compose_doc, emit_k8s, k8s_docs

K8S_VERSION = "1.37.0"
MN = MultiNode(flags=("--nnodes", "{nnodes}", "--node-rank", "{node_rank}", "--addr",
                      "{leader}"), worker_flags=("--headless",), worker_serves_http=False)


def _launch(**kw) -> Launch:
    base = dict(image="reg/imgbuild:tag1", engine="sglang", name="imgbuild-My_Model.v1",
                command=("python3", "-m", "serve", "--tp", "8"), port=30000, host_port=31000,
                health_path="/health", models_path="/v1/models", ready_paths=("/health",),
                env=(("HF_HOME", "/root/.cache/huggingface"), ("X", "1")), gpus="all",
                ipc_host=False, shm_size="32g", ulimits=(("memlock", -1, -1),
                                                         ("nofile", 1024, 65536)),
                volumes=(("/h/cache", "/root/.cache/huggingface", "rw"),
                         ("/h/ckpt", "/models/ckpt", "ro")),
                phases=(), pass_env=("HF_TOKEN",), model="org/m", model_source="hub",
                target="t", tensor_parallel=8, startup_timeout_s=1805, multi_node=MN,
                model_size_gb=50.0)
    base.update(kw)
    return Launch(**base)


def _kinds(docs):
    return {d["kind"]: d for d in docs if d["kind"] != "PersistentVolumeClaim"}


# --- docker run ----------------------------------------------------------------------------

def test_docker_args_flags():
    a = _launch().docker_args(detach=True, rm=False)
    assert a[:3] == ["docker", "run", "-d"] and "--rm" not in a
    assert "--rm" in _launch().docker_args() and "-d" not in _launch().docker_args()
    assert a[a.index("--name") + 1] == "imgbuild-My_Model.v1"
    assert a[a.index("--shm-size") + 1] == "32g" and "--ipc" not in a
    ul = [a[i + 1] for i, x in enumerate(a) if x == "--ulimit"]
    assert ul == ["memlock=-1", "nofile=1024:65536"]  # one value when soft == hard
    assert a[a.index("-p") + 1] == "31000:30000"  # host:container
    vols = [a[i + 1] for i, x in enumerate(a) if x == "-v"]
    assert vols == ["/h/cache:/root/.cache/huggingface:rw", "/h/ckpt:/models/ckpt:ro"]
    envs = [a[i + 1] for i, x in enumerate(a) if x == "-e"]
    assert envs == ["HF_HOME=/root/.cache/huggingface", "X=1", "HF_TOKEN"]  # a secret: no value
    assert a[a.index("reg/imgbuild:tag1") + 1:] == list(_launch().command)


def test_ipc_host_drops_shm_size_and_no_gpus_drops_the_flag():
    a = _launch(ipc_host=True, gpus=None).docker_args()
    assert a[a.index("--ipc") + 1] == "host" and "--shm-size" not in a and "--gpus" not in a
    a = _launch().docker_args()
    assert a[a.index("--gpus") + 1] == "all"


def test_pinned_image_uses_the_digest_when_known():
    assert _launch().pinned_image == "reg/imgbuild:tag1"
    d = "sha256:" + "cd" * 32
    assert _launch(image_digest=d).pinned_image == f"reg/imgbuild:tag1@{d}"


# --- compose -------------------------------------------------------------------------------

def test_compose_service_fields():
    (name, svc), = compose_doc(_launch())["services"].items()
    assert name == "imgbuild-my-model-v1"
    assert svc["ports"] == ["31000:30000"] and svc["container_name"] == "imgbuild-My_Model.v1"
    assert svc["shm_size"] == "32g" and "ipc" not in svc
    assert svc["ulimits"] == {"memlock": -1, "nofile": {"soft": 1024, "hard": 65536}}
    assert svc["environment"] == ["HF_HOME=/root/.cache/huggingface", "X=1", "HF_TOKEN"]
    assert svc["volumes"] == ["/h/cache:/root/.cache/huggingface:rw", "/h/ckpt:/models/ckpt:ro"]
    assert svc["deploy"]["resources"]["reservations"]["devices"] == [
        {"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]
    hc = svc["healthcheck"]
    assert hc["start_period"] == "1805s"
    assert "http://127.0.0.1:30000/health" in hc["test"][-1]  # the container's port
    svc = compose_doc(_launch(ipc_host=True, gpus=None, ulimits=(), env=(), pass_env=(),
                              volumes=()))["services"]["imgbuild-my-model-v1"]
    assert svc["ipc"] == "host" and "shm_size" not in svc
    assert not {"deploy", "ulimits", "environment", "volumes"} & set(svc)


# --- Kubernetes ----------------------------------------------------------------------------

@pytest.mark.parametrize("raw, name", [
    ("imgbuild-My_Model.v1", "imgbuild-my-model-v1"), ("--x--", "x"), ("___", "imgbuild"),
    ("a" * 60, "a" * 50), ("a" * 49 + "-b", "a" * 49)])
def test_k8s_names_are_dns_labels_short_enough_for_lws_pods(raw, name):
    assert L._k8s_name(raw) == name


@pytest.mark.parametrize("size, q", [("32g", "32Gi"), ("512m", "512Mi"), ("64k", "64Ki"),
                                     ("100", "100"), ("7b", "7"), ("2G", "2Gi")])
def test_docker_sizes_become_binary_quantities(size, q):
    assert L._quantity(size) == q


def test_deployment_carries_gpus_probes_env_secrets_and_claims():
    docs = k8s_docs(_launch(), gpus_per_node=8)
    kinds = [d["kind"] for d in docs]
    assert kinds == ["Deployment", "Service", "PersistentVolumeClaim", "PersistentVolumeClaim"]
    dep, svc = docs[0], docs[1]
    assert dep["spec"]["strategy"] == {"type": "Recreate"} and dep["spec"]["replicas"] == 1
    pod = dep["spec"]["template"]["spec"]
    assert pod["securityContext"] == {"runAsNonRoot": True, "runAsUser": L.ANY_UID,
                                      "runAsGroup": 0, "fsGroup": 0,
                                      "seccompProfile": {"type": "RuntimeDefault"}}
    (c,) = pod["containers"]
    assert c["args"] == list(_launch().command) and "command" not in c
    assert c["resources"] == {"limits": {"nvidia.com/gpu": 8}}
    assert c["ports"] == [{"name": "http", "containerPort": 30000}]
    assert c["env"] == [
        {"name": "HF_HOME", "value": "/root/.cache/huggingface"}, {"name": "X", "value": "1"},
        {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {
            "name": "imgbuild-my-model-v1-env", "key": "HF_TOKEN", "optional": True}}}]
    assert c["startupProbe"]["failureThreshold"] == math.ceil(1805 / L.PROBE_PERIOD_S) == 181
    assert c["startupProbe"]["periodSeconds"] == L.PROBE_PERIOD_S
    assert c["readinessProbe"]["failureThreshold"] == 3
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["runAsNonRoot"] is True
    assert c["volumeMounts"] == [
        {"name": "tmp", "mountPath": "/tmp"}, {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "huggingface", "mountPath": "/root/.cache/huggingface", "readOnly": False},
        {"name": "ckpt", "mountPath": "/models/ckpt", "readOnly": True}]
    vols = {v["name"]: v for v in pod["volumes"]}
    assert vols["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "32Gi"}
    assert vols["ckpt"]["persistentVolumeClaim"] == {
        "claimName": "imgbuild-my-model-v1-ckpt", "readOnly": True}
    assert vols["huggingface"]["persistentVolumeClaim"]["readOnly"] is False
    assert svc["spec"] == {"selector": {"app.kubernetes.io/name": "imgbuild-my-model-v1"},
                           "ports": [{"name": "http", "port": 30000, "targetPort": "http"}]}
    cache, ckpt = docs[2], docs[3]
    assert cache["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert ckpt["spec"]["accessModes"] == ["ReadOnlyMany"]
    assert cache["spec"]["resources"]["requests"]["storage"] == "60Gi"  # 50 GB and a fifth
    assert ckpt["metadata"]["name"] == "imgbuild-my-model-v1-ckpt"
    assert ckpt["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "imgbuild"


@pytest.mark.parametrize("gb, size", [(None, "100Gi"), (1.0, "10Gi"), (8.4, "11Gi"),
                                      (600.0, "720Gi")])
def test_a_claim_holds_the_weights_and_a_fifth_at_least_10gi(gb, size):
    docs = k8s_docs(_launch(model_size_gb=gb), gpus_per_node=8)
    assert docs[2]["spec"]["resources"]["requests"]["storage"] == size


def test_tensor_parallel_up_to_a_node_is_one_deployment():
    assert k8s_docs(_launch(tensor_parallel=4), gpus_per_node=8)[0]["spec"]["template"][
        "spec"]["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": 4}}
    assert k8s_docs(_launch(tensor_parallel=8), gpus_per_node=8)[0]["kind"] == "Deployment"
    assert k8s_docs(_launch(tensor_parallel=9, multi_node=MN), gpus_per_node=3)[0]["kind"] \
        == "LeaderWorkerSet"
    # A CPU image: no GPUs whatever its tensor parallelism says.
    cpu = k8s_docs(_launch(gpus=None, tensor_parallel=16, multi_node=None), gpus_per_node=1)
    assert cpu[0]["kind"] == "Deployment"
    assert "resources" not in cpu[0]["spec"]["template"]["spec"]["containers"][0]
    with pytest.raises(InputError, match="at least 1"):
        k8s_docs(_launch(), gpus_per_node=0)


def test_leaderworkerset_splits_evenly_and_only_the_leader_serves():
    lws, svc, *_ = k8s_docs(_launch(tensor_parallel=16), gpus_per_node=8)
    tpl = lws["spec"]["leaderWorkerTemplate"]
    assert tpl["size"] == 2
    leader, = tpl["leaderTemplate"]["spec"]["containers"]
    worker, = tpl["workerTemplate"]["spec"]["containers"]
    flags = ["--nnodes", "$(LWS_GROUP_SIZE)", "--node-rank", "$(LWS_WORKER_INDEX)", "--addr",
             "$(LWS_LEADER_ADDRESS)"]
    assert leader["args"] == list(_launch().command) + flags
    assert worker["args"] == list(_launch().command) + flags + ["--headless"]
    assert leader["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert "startupProbe" in leader and "ports" in leader
    assert "startupProbe" not in worker and "ports" not in worker
    assert tpl["leaderTemplate"]["metadata"]["labels"]["role"] == "leader"
    assert tpl["workerTemplate"]["metadata"]["labels"]["role"] == "worker"
    assert svc["metadata"]["name"] == "imgbuild-my-model-v1-api"
    assert svc["spec"]["selector"] == {L.LWS_NAME_LABEL: "imgbuild-my-model-v1",
                                       "role": "leader"}
    # A worker that serves HTTP gets its probes.
    serving = dataclasses.replace(MN, worker_serves_http=True)
    lws, *_ = k8s_docs(_launch(tensor_parallel=16, multi_node=serving), gpus_per_node=8)
    worker, = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"]
    assert "startupProbe" in worker and "ports" in worker
    # 12 over nodes of 8: 2 nodes of 6.
    lws, *_ = k8s_docs(_launch(tensor_parallel=12), gpus_per_node=8)
    assert lws["spec"]["leaderWorkerTemplate"]["size"] == 2
    c, = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 6
    with pytest.raises(InputError, match="does not split evenly over 3 nodes"):
        k8s_docs(_launch(tensor_parallel=8), gpus_per_node=3)
    with pytest.raises(InputError, match="no multi-node launch"):
        k8s_docs(_launch(tensor_parallel=16, multi_node=None), gpus_per_node=8)


def test_no_shm_size_means_no_dshm_volume():
    pod = k8s_docs(_launch(shm_size=None, volumes=()), gpus_per_node=8)[0]["spec"]["template"][
        "spec"]
    assert pod["volumes"] == [{"name": "tmp", "emptyDir": {}}]
    assert pod["containers"][0]["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp"}]


def test_the_manifests_validate_against_the_kubernetes_schemas():
    kv = pytest.importorskip("kubernetes_validate")
    for one in (_launch(image_digest="sha256:" + "ab" * 32), _launch(root_only="why"),
              _launch(gpus=None, pass_env=(), volumes=())):
        for d in k8s_docs(one, gpus_per_node=8):
            kv.validate(d, K8S_VERSION, strict=True)
    lws = k8s_docs(_launch(tensor_parallel=16), gpus_per_node=8)[0]
    for t in ("leaderTemplate", "workerTemplate"):
        tpl = lws["spec"]["leaderWorkerTemplate"][t]
        kv.validate({"apiVersion": "v1", "kind": "Pod",
                     "metadata": {"name": "p", **tpl["metadata"]}, "spec": tpl["spec"]},
                    K8S_VERSION, strict=True)


def test_emitted_files_and_their_notes(tmp_path):
    files = emit_k8s(_launch(root_only="writes\n  beside   itself"), tmp_path, gpus_per_node=8)
    assert [f.name for f in files] == [
        "imgbuild-my-model-v1-deployment.yaml", "imgbuild-my-model-v1-service.yaml",
        "imgbuild-my-model-v1-huggingface-persistentvolumeclaim.yaml",
        "imgbuild-my-model-v1-ckpt-persistentvolumeclaim.yaml"]
    text = files[0].read_text()
    assert "memlock=-1, nofile=1024" in text
    assert "nvidia.com/gpu" in text and "HF_TOKEN: from the Secret imgbuild-my-model-v1-env" in text
    assert "named by tag" in text and "runs as root only (writes beside itself)" in text
    assert yaml.safe_load(text)["kind"] == "Deployment"
    files = emit_k8s(_launch(image_digest="sha256:" + "ab" * 32, gpus=None, ulimits=(),
                             pass_env=()), tmp_path / "b", gpus_per_node=8)
    text = files[0].read_text()
    assert "named by tag" not in text and "nvidia.com/gpu" not in text
    assert "root only" not in text and "ulimits" not in text


def test_one_yaml_style_and_one_write_for_every_launch_file(tmp_path):
    """plan/manifests.py, used for the compose file, the manifests and the admission policy:
    no &anchors (a shared dict written out twice), text of several lines as a `|` block that
    reads back the same, one-line text plain; a refused write is the error that names the
    file, and leaves none behind."""
    from imgbuild.errors import EnvError
    from imgbuild.plan.manifests import dump, write

    probe = {"httpGet": {"path": "/health", "port": 8000}}
    pem = "-----BEGIN PUBLIC KEY-----\nMFkw\n-----END PUBLIC KEY-----\n"
    doc = {"startupProbe": probe, "livenessProbe": probe, "key": pem, "image": "reg/x:t"}
    text = dump(doc)
    assert "&" not in text and "*" not in text
    assert "key: |\n  -----BEGIN PUBLIC KEY-----\n  MFkw\n" in text
    assert "image: reg/x:t\n" in text and list(yaml.safe_load(text)) == list(doc)
    assert yaml.safe_load(text) == doc
    write(tmp_path / "a" / "f.yaml", text)
    assert (tmp_path / "a" / "f.yaml").read_text() == text
    (tmp_path / "file").write_text("")
    with pytest.raises(EnvError) as e:
        write(tmp_path / "file" / "f.yaml", text)
    assert e.value.message.startswith(f"cannot write a launch file {tmp_path / 'file' / 'f.yaml'}")
    assert e.value.exit_code == 3


# --- launch_for on the checkout's plans ------------------------------------------------------

def _table(ws):
    from imgbuild.catalog.launch import load_launch
    return load_launch([layer.images for layer in ws.layers])


def test_a_cpu_image_gets_no_gpus_even_from_an_engine_that_wants_them(ws):
    from imgbuild.plan.decide import make_plan
    from imgbuild.plan.launch import launch_for
    table = _table(ws)
    gpu_plan = make_plan(ws, "sglang-blackwell", resolve=False)
    assert table.engine(gpu_plan.engine).gpus
    assert launch_for(gpu_plan, None, table).gpus == "all"
    cpu_plan = dataclasses.replace(gpu_plan, archs=("cpu",))
    assert launch_for(cpu_plan, None, table).gpus is None


def test_the_smoke_model_is_served_on_one_gpu(ws):
    from imgbuild.plan.decide import make_plan
    from imgbuild.plan.launch import launch_for
    table = _table(ws)
    plan = make_plan(ws, "sglang-blackwell", resolve=False)
    smoke = dataclasses.replace(ws.model(plan.smoke_model), tensor_parallel=4)
    got = launch_for(plan, smoke, table)
    assert got.model_source == "smoke" and got.tensor_parallel == 1
    assert got.name == f"imgbuild-{plan.smoke_model}"
    hub = launch_for(make_plan(ws, "sglang-blackwell", model="k2.6", resolve=False),
                     ws.model("k2.6"), table, host_port=31234)
    assert hub.model_source == "hub" and hub.tensor_parallel == ws.model("k2.6").tensor_parallel
    assert hub.host_port == 31234 and hub.port != 31234


# --- the launch table (catalog/launch.py) ----------------------------------------------------

def _load_edited(tmp_path, edit):
    from imgbuild.catalog.launch import LAUNCH_FILES, load_launch

    from .conftest import ROOT
    images = tmp_path / "images"
    (images / "checks").mkdir(parents=True)
    data = yaml.safe_load((ROOT / "images" / LAUNCH_FILES[0]).read_text())
    edit(data)
    (images / LAUNCH_FILES[0]).write_text(yaml.safe_dump(data, sort_keys=False))
    return load_launch(images)


@pytest.mark.parametrize("value, got", [
    (5, ("nofile", 5, 5)), ({"soft": 1, "hard": 2}, ("nofile", 1, 2)),
    ({"soft": 2, "hard": 2}, ("nofile", 2, 2)), ({"soft": 5, "hard": -1}, ("nofile", 5, -1)),
    ({"soft": -1, "hard": -1}, ("nofile", -1, -1)), (-1, ("nofile", -1, -1)),
    ({"soft": 3, "hard": 2}, None), ({"soft": -1, "hard": 5}, None), (-2, None), (True, None),
    ({"soft": 0, "hard": 0}, ("nofile", 0, 0)),
])
def test_ulimits_soft_never_above_hard(tmp_path, value, got):
    from imgbuild.errors import SpecError

    def edit(d):
        d["engines"]["sglang"]["ulimits"] = {"nofile": value}
    if got is None:
        with pytest.raises(SpecError) as e:
            _load_edited(tmp_path, edit)
        assert e.value.key == "engines.sglang.ulimits.nofile"
    else:
        assert _load_edited(tmp_path, edit).engine("sglang").ulimits == (got,)


def test_phases_are_kept_in_their_order_not_the_files(tmp_path):
    def edit(d):
        d["engines"]["sglang"]["phases"] = {"ready": "R", "loading": "L", "graphs": "G"}
    t = _load_edited(tmp_path, edit)
    assert [p for p, _ in t.engine("sglang").phases] == ["loading", "graphs", "ready"]


def test_multi_node_flags_must_tell_every_node_its_place(tmp_path):
    from imgbuild.errors import SpecError

    def edit(d):
        d["engines"]["sglang"]["multi_node"] = {"flags": ["--n", "{nnodes}", "--r",
                                                          "{node_rank}", "--a", "{leader}"]}
    mn = _load_edited(tmp_path, edit).engine("sglang").multi_node
    assert mn.worker_flags == () and mn.worker_serves_http is False

    def drop(d):
        d["engines"]["sglang"]["multi_node"] = {"flags": ["--n", "{nnodes}", "--a", "{leader}"]}
    with pytest.raises(SpecError) as e:
        _load_edited(tmp_path / "b", drop)
    assert e.value.key == "engines.sglang.multi_node.flags" and "{node_rank}" in str(e.value)

    def none(d):
        d["engines"]["sglang"]["multi_node"] = None
    assert _load_edited(tmp_path / "c", none).engine("sglang").multi_node is None


# --- launch_for's refusals, word for word ----------------------------------------------------

def _ws():
    from .conftest import checkout_workspace
    return checkout_workspace()


def _plan(ws, target="tiny-cpu", model=None, **changes):
    from imgbuild.plan.decide import make_plan
    return dataclasses.replace(make_plan(ws, target, model=model, resolve=False), **changes)


def test_a_target_with_no_model_and_no_smoke_model_has_nothing_to_serve():
    ws = _ws()
    with pytest.raises(InputError) as e:
        L.launch_for(_plan(ws, smoke_model=None), None, ws.launch)
    assert (e.value.message, e.value.facts, e.value.hint) == (
        "cannot serve from tiny-cpu: target 'tiny-cpu' names no model, and the image carries "
        "no model", ["target 'tiny-cpu' has no smoke model"],
        "name a model profile (--model ALIAS)")


def test_a_generated_model_other_than_the_images_smoke_model_is_refused():
    ws = _ws()
    other = dataclasses.replace(ws.model("tiny-nvfp4"), alias="tiny-other")
    with pytest.raises(InputError) as e:
        L.launch_for(_plan(ws), other, ws.launch)
    assert (e.value.message, e.value.facts, e.value.hint) == (
        "cannot serve from tiny-cpu: model 'tiny-other' is generated, and the image carries "
        "only its smoke model 'tiny-nvfp4'",
        [f"{ws.launch.models.smoke_model} in the image is the smoke model (tiny-nvfp4)"],
        "name a model profile with a hub or local checkpoint (--model ALIAS), or serve the "
        "smoke model: --model tiny-nvfp4")


def test_a_revision_an_engine_cannot_pin_is_refused_and_one_it_can_is_passed():
    ws = _ws()
    k26 = dataclasses.replace(ws.model("k2.6"), revision="abc123")
    plan = _plan(ws, "sglang-blackwell", "k2.6")
    got = L.launch_for(plan, k26, ws.launch)
    flag = ws.launch.engine("sglang").revision_flag
    assert got.command[got.command.index(flag) + 1] == "abc123"
    table = dataclasses.replace(ws.launch, engines=ws.launch.engines | {
        "sglang": dataclasses.replace(ws.launch.engine("sglang"), revision_flag=None)})
    with pytest.raises(InputError) as e:
        L.launch_for(plan, k26, table)
    assert (e.value.message, e.value.facts, e.value.hint) == (
        f"{k26.path}: revision: abc123 cannot be passed to sglang",
        [f"{table.source}: engines.sglang has no revision_flag"],
        "drop revision: or download that revision and name the directory")


def test_the_container_is_named_for_the_model_and_labelled_with_target_and_model():
    ws = _ws()
    got = L.launch_for(_plan(ws, "sglang-blackwell", "k2.6"), ws.model("k2.6"), ws.launch)
    assert got.name == "imgbuild-k2.6"
    assert dict(got.labels) == {"imgbuild.target": "sglang-blackwell", "imgbuild.model": "k2.6"}
    assert (got.engine, got.target, got.model_source, got.tensor_parallel) == (
        "sglang", "sglang-blackwell", "hub", 8)
    assert dict(got.env_set_by)[ws.launch.models.hf_cache_env] == "the model cache's mount"
    smoke = L.launch_for(_plan(ws), None, ws.launch)
    assert dict(smoke.labels) == {"imgbuild.target": "tiny-cpu", "imgbuild.model": "tiny-nvfp4"}
    assert smoke.model_source == "smoke" and smoke.tensor_parallel == 1
    assert ws.launch.models.hf_cache_env not in dict(smoke.env_set_by)
    with pytest.raises(InputError) as e:
        L.launch_for(_plan(ws), None, ws.launch, name="-x")
    assert (e.value.message, e.value.hint) == (
        "container name '-x': docker takes letters, digits, '_', '.' and '-', starting with a "
        "letter or digit", "pick another --name")
    assert L.launch_for(_plan(ws), None, ws.launch, name="Ab.c_d-1").name == "Ab.c_d-1"


def test_an_alias_docker_cannot_name_a_container_by_is_made_one_it_can():
    ws = _ws()
    odd = dataclasses.replace(ws.model("k2.6"), alias="-.my model/v1._")
    got = L.launch_for(_plan(ws, "sglang-blackwell", "k2.6"), odd, ws.launch)
    assert got.name == "imgbuild-my-model-v1"


def test_the_manifests_header_word_for_word(tmp_path):
    """The comment lines above the manifests: each is what a person applying them must know.
    Checked whole for one Deployment (one node) and one LeaderWorkerSet (two)."""
    from imgbuild.catalog.launch import load_launch

    from .conftest import ROOT

    dirs = load_launch(ROOT / "images").write_dirs("sglang")
    one = emit_k8s(_launch(write_dirs=dirs, platforms=("linux/amd64",)), tmp_path / "one",
                   gpus_per_node=8)[0].read_text()
    head = one.split("\napiVersion:")[0].splitlines()
    assert head[:3] == [
        "# Generated by imgbuild: t (sglang) serving org/m.",
        f"# Start: kubectl apply -f {tmp_path / 'one'}",
        "# Ready when GET /health and /v1/models answer 200 on port 30000."]
    assert "# HF_TOKEN: from the Secret imgbuild-my-model-v1-env when it exists (kubectl create "\
           "secret generic ... --from-literal=NAME=VALUE)." in head
    assert "# The image is linux/amd64 only: the pods go to nodes of that arch " \
           "(kubernetes.io/arch)." in head
    writes = " ".join(x[2:] for x in head if x.startswith("# ") and not x.startswith(
        ("# Generated", "# Start", "# Ready", "# A Pod", "# The GPUs", "# needs", "# HF_TOKEN",
         "# The image")))
    assert writes.startswith("Written by the server (the root is read-only): /root: HOME, "
                             "XDG_CACHE_HOME, TRITON_CACHE_DIR, ")
    assert writes.endswith("; /tmp: TMPDIR, TORCHINDUCTOR_CACHE_DIR; /root/.cache/huggingface: "
                           "HF_HOME.")
    start = next(i for i, x in enumerate(head) if x.startswith("# Written by the server"))
    end = next(i for i, x in enumerate(head) if x.endswith("HF_HOME."))
    assert end > start and all(len(x) <= 98 for x in head[start:end + 1])  # 96 after "# "
    lws = emit_k8s(_launch(write_dirs=dirs), tmp_path / "two", gpus_per_node=4)
    text = next(f for f in lws if f.name.endswith("-leaderworkerset.yaml")).read_text()
    assert "# A LeaderWorkerSet (kubernetes-sigs/lws, its controller must be installed): 2 pods, " \
           "one a node; the leader serves HTTP.\n" in text


def test_a_manifest_keeps_its_key_order_block_style_and_100_columns():
    from imgbuild.plan.manifests import dump

    words = " ".join(["word"] * 30)
    assert dump({"b": 1, "a": [1, 2], "m": {"k": "v"}, "long": words}) == (
        "b: 1\na:\n- 1\n- 2\nm:\n  k: v\n"
        "long: " + " ".join(["word"] * 20) + "\n  " + " ".join(["word"] * 10) + "\n")


def test_a_long_value_folds_at_the_first_space_past_100_columns():
    from imgbuild.plan.manifests import dump

    long = " ".join(["word"] * 40) + " xx"
    assert dump({"k": long}) == ("k: " + " ".join(["word"] * 20) + "\n  "
                                 + " ".join(["word"] * 20) + "\n  xx\n")
