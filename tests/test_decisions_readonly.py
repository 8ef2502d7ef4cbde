"""Where a serving container writes, decided on plain data (plan/launch.py write_targets): the
image's env, the launch's env and mounts, and the directories images/checks/launch.yaml says the
engines write. `imgbuild run --read-only` refuses a run that leaves one of them read-only;
`--emit k8s` gives each one the pod's mounts leave on the read-only root an emptyDir. No
Docker here: tests/test_run.py runs the real container."""

from __future__ import annotations

import ast
import dataclasses

import pytest
import yaml

from imgbuild.catalog.launch import LAUNCH_FILES, WriteDir, load_launch
from imgbuild.errors import InputError, SpecError
from imgbuild.plan import launch as L
from imgbuild.plan.labels import RUN_ENV, RUN_HOME
from imgbuild.plan.launch import Launch, compose_doc

from .conftest import ROOT

TABLE = load_launch(ROOT / "images")
DIRS = TABLE.write_dirs("sglang")


def _launch(**kw) -> Launch:
    base = dict(image="reg/imgbuild:tag1", engine="sglang", name="imgbuild-m", command=("serve",),
                port=30000, host_port=30000, health_path="/health", models_path="/v1/models",
                ready_paths=("/health",), env=(("HF_HOME", "/cache/huggingface"),), gpus="all",
                ipc_host=True, shm_size="32g", ulimits=(),
                volumes=(("/h/hf", "/cache/huggingface", "rw"), ("/h/ckpt", "/models/m", "ro")),
                phases=(), image_env=RUN_ENV, write_dirs=DIRS, tensor_parallel=8,
                model="org/m", multi_node=None)
    base.update(kw)
    return Launch(**base)


def _ro(launch: Launch) -> Launch:
    return L.read_only(launch, TABLE.writable.tmpfs)


# --- the decision -------------------------------------------------------------------------------

def test_each_directory_resolves_as_the_engine_resolves_it():
    env = dict(RUN_ENV) | {"HF_HOME": "/cache/huggingface"}
    got = dict(L.resolve_write_dirs(env, DIRS))
    assert got["HOME"] == RUN_HOME == "/tmp/home"
    assert got["XDG_CACHE_HOME"] == "/tmp/home/.cache"  # the image sets it
    assert got["TRITON_CACHE_DIR"] == "/tmp/home/.triton/cache"  # ~ is HOME
    assert got["TORCH_EXTENSIONS_DIR"] == "/tmp/home/.cache/torch_extensions"  # {XDG_CACHE_HOME}
    assert got["TORCHINDUCTOR_CACHE_DIR"] == "/tmp/torchinductor_imgbuild"  # {TMPDIR}, {USER}
    assert got["HF_HOME"] == "/cache/huggingface"  # a variable set wins over the default
    assert "VLLM_CACHE_ROOT" not in got  # vLLM's only
    assert dict(L.resolve_write_dirs(env, TABLE.write_dirs("vllm")))["VLLM_CACHE_ROOT"] == \
        "/tmp/home/.cache/vllm"
    # A moved XDG_CACHE_HOME moves what defaults under it, not what defaults under HOME.
    moved = dict(L.resolve_write_dirs(env | {"XDG_CACHE_HOME": "/x"}, DIRS))
    assert moved["TORCH_EXTENSIONS_DIR"] == "/x/torch_extensions"
    assert moved["FLASHINFER_WORKSPACE_BASE"] == "/tmp/home/.cache/flashinfer"


def test_a_read_only_run_of_the_image_as_built_writes_only_on_its_mounts():
    launch = _ro(_launch())
    assert L.unwritable_dirs(launch) == []
    where = {t.env: t.mount for t in L.write_targets(
        launch.container_env, DIRS, launch.mounts(), root_writable=False)}
    assert where["HF_HOME"] == "/cache/huggingface"
    assert {m for v, m in where.items() if v != "HF_HOME"} == {"/tmp"}
    L.refuse_unwritable(launch)  # nothing to refuse


def test_a_writable_root_leaves_nothing_to_refuse():
    assert L.unwritable_dirs(_launch(env=(("TRITON_CACHE_DIR", "/opt/t"),))) == []


@pytest.mark.parametrize("env, bad", [
    ((("TRITON_CACHE_DIR", "/opt/triton"),), {"TRITON_CACHE_DIR": (None, "/opt/triton")}),
    # HOME on the root takes every default under it along.
    ((("HOME", "/root"),), {"HOME": (None, "/root"), "TRITON_CACHE_DIR": (None, None),
                            "FLASHINFER_WORKSPACE_BASE": (None, None),
                            "DG_JIT_CACHE_DIR": (None, None), "TVM_FFI_CACHE_DIR": (None, None),
                            "CUDA_CACHE_PATH": (None, None), "NUMBA_CACHE_DIR": (None, None)}),
    # A cache on the read-only checkpoint mount is as read-only as the root.
    ((("HF_HOME", "/models/m/hf"),), {"HF_HOME": ("/models/m", "/models/m/hf")}),
    # The tmpfs's own path and the cache mount's are writable, and so is below them.
    ((("TRITON_CACHE_DIR", "/tmp"), ("DG_JIT_CACHE_DIR", "/cache/huggingface/dg")), {}),
    # A prefix that is not a parent directory: /tmpx is not under /tmp.
    ((("TVM_FFI_CACHE_DIR", "/tmpx/tvm"),), {"TVM_FFI_CACHE_DIR": (None, "/tmpx/tvm")}),
])
def test_a_read_only_run_names_each_directory_left_read_only(env, bad):
    launch = _ro(L.with_env(_launch(), env, "--env"))
    got = {t.env: t for t in L.unwritable_dirs(launch)}
    assert set(got) == set(bad)
    for var, (mount, path) in bad.items():
        assert got[var].mount == mount and not got[var].writable
        if path:
            assert got[var].path == path
    for var, _v in env:
        if var in got:
            assert got[var].set_by == "--env"


def test_the_refusal_says_which_directory_which_variable_and_the_way_out():
    launch = _ro(L.with_env(_launch(), (("TRITON_CACHE_DIR", "/opt/triton"),), "--env"))
    with pytest.raises(InputError) as e:
        L.refuse_unwritable(launch)
    err = e.value
    assert err.exit_code == 2
    assert err.message == ("cannot run imgbuild-m --read-only: 1 directory the server writes "
                           "would be read-only")
    assert err.facts[0] == ("TRITON_CACHE_DIR=/opt/triton (set by --env) lies on the read-only "
                            "root")
    assert "writable in the container: /tmp, /cache/huggingface" in err.facts
    assert err.facts[-1] == "nothing was started"
    assert err.hint.startswith("drop --env TRITON_CACHE_DIR, or point TRITON_CACHE_DIR under /tmp")
    # A default that lands on the root says it was not set.
    home = _ro(L.with_env(_launch(), (("HOME", "/root"),), "--env"))
    with pytest.raises(InputError) as e:
        L.refuse_unwritable(home)
    assert ("NUMBA_CACHE_DIR is not set: its default /root/.cache/numba lies on the read-only "
            "root") in e.value.facts


def test_a_root_only_image_is_never_run_read_only():
    launch = _ro(_launch(root_only="the engine writes its kernels beside its modules",
                         target="t"))
    with pytest.raises(InputError) as e:
        L.refuse_unwritable(launch)
    assert e.value.message == ("cannot run imgbuild-m --read-only: the image writes to its "
                               "root filesystem")
    assert e.value.facts[0] == ("target t: smoke.root_only: the engine writes its kernels "
                                "beside its modules")
    L.refuse_unwritable(_launch(root_only="why"))  # not read-only: nothing to refuse


# --- docker run and compose ---------------------------------------------------------------------

def test_read_only_mounts_every_tmpfs_exec():
    a = _ro(_launch()).docker_args()
    assert "--read-only" in a
    assert [a[i + 1] for i, x in enumerate(a) if x == "--tmpfs"] == ["/tmp:rw,exec,nosuid,nodev"]
    plain = _launch().docker_args()
    assert "--read-only" not in plain and "--tmpfs" not in plain
    svc = next(iter(compose_doc(_ro(_launch()))["services"].values()))
    assert svc["read_only"] is True and svc["tmpfs"] == ["/tmp:rw,exec,nosuid,nodev"]
    assert "tmpfs" not in next(iter(compose_doc(_launch())["services"].values()))
    # Whatever the table names is mounted, each with exec.
    two = L.read_only(_launch(), ("/tmp", "/var/cache/jit"))
    assert all("exec" in t.split(":")[1].split(",") and "noexec" not in t
               for t in [x for i, x in enumerate(two.docker_args()) if i and
                         two.docker_args()[i - 1] == "--tmpfs"])


# --- Kubernetes: the same list ------------------------------------------------------------------

def test_k8s_gives_an_emptydir_to_each_cache_moved_off_tmp():
    assert L.k8s_cache_dirs(_launch()) == ()  # the image's caches are all under /tmp
    moved = L.with_env(_launch(), (("TRITON_CACHE_DIR", "/var/triton"),
                                   ("DG_JIT_CACHE_DIR", "/var/triton/dg")), "--env")
    assert L.k8s_cache_dirs(moved) == (("cache-triton-cache-dir", "/var/triton"),)
    assert L.k8s_cache_dirs(dataclasses.replace(moved, root_only="why")) == ()  # root writable
    on_ckpt = L.with_env(_launch(), (("HF_HOME", "/models/m/hf"),), "--env")
    with pytest.raises(InputError, match="in Kubernetes: 1 directory"):
        L.k8s_cache_dirs(on_ckpt)


# --- the data -----------------------------------------------------------------------------------

def test_the_table_lists_what_the_image_s_any_user_check_writes():
    """The smoke test's any-user stage (imgbuild/payload/anyuser.py, standard library only, so it
    cannot read the YAML) checks the same directories, by the same variables."""
    tree = ast.parse((ROOT / "imgbuild" / "payload" / "anyuser.py").read_text())
    caches = next(n.value for n in tree.body if isinstance(n, ast.Assign)
                  and getattr(n.targets[0], "id", "") == "CACHES")
    payload_vars = {ast.literal_eval(e)[1] for e in caches.elts}
    table_vars = {d.env for d in TABLE.writable.dirs if not d.engines}
    assert payload_vars == table_vars


def _table_with(tmp_path, edit):
    data = yaml.safe_load((ROOT / "images" / LAUNCH_FILES[0]).read_text())
    edit(data)
    images = tmp_path / "images"
    (images / "checks").mkdir(parents=True)
    (images / LAUNCH_FILES[0]).write_text(yaml.safe_dump(data, sort_keys=False))
    return images


@pytest.mark.parametrize("edit, key, expected", [
    (lambda d: d["writable"]["dirs"].insert(0, {"env": "X", "default": "~/x"}),
     "writable.dirs", "HOME first"),
    (lambda d: d["writable"]["dirs"].append({"env": "Y", "default": "{NOPE}/y"}),
     "writable.dirs[13].default", "a {VAR} that an entry above names"),
    (lambda d: d["writable"]["dirs"].append({"env": "Y", "default": "rel/y"}),
     "writable.dirs[13].default", "~/PATH, {VAR}/PATH or an absolute path"),
    (lambda d: d["writable"]["dirs"].append({"env": "Y", "default": "~/y", "engines": ["tgi"]}),
     "writable.dirs[13].engines[0]", "an engine"),
    (lambda d: d["writable"].update(tmpfs=["/tmp:noexec"]), "writable.tmpfs[0]",
     "no options"),
    (lambda d: d["rdma"].update(resource="rdma"), "rdma.resource", "DOMAIN/NAME"),
    (lambda d: d["rdma"].update(capabilities=["CAP_IPC_LOCK"]), "rdma.capabilities[0]",
     "without CAP_"),
    (lambda d: d["gke"]["env"].update({"1BAD": "x"}), "gke.env.1BAD",
     "an environment variable name"),
    (lambda d: d.pop("writable"), "writable", "a mapping"),
])
def test_a_bad_writable_gke_or_rdma_entry_names_file_and_key(tmp_path, edit, key, expected):
    with pytest.raises(SpecError) as e:
        load_launch(_table_with(tmp_path, edit))
    assert e.value.key == key and expected in str(e.value), str(e.value)


def test_the_shipped_table_s_cluster_facts():
    assert TABLE.writable.tmpfs == ("/tmp",)
    assert dict(TABLE.gke_env) == {"LD_LIBRARY_PATH": "/usr/local/nvidia/lib64"}
    assert TABLE.rdma.resource == "rdma/ib" and TABLE.rdma.capabilities == ("IPC_LOCK",)
    assert dict(TABLE.rdma.env) == {"NCCL_IB_HCA": "mlx5", "NCCL_IB_GID_INDEX": "",
                                    "NCCL_SOCKET_IFNAME": "eth0"}
    assert WriteDir("A", "~/a", ("vllm",)).for_engine("vllm")
    assert not WriteDir("A", "~/a", ("vllm",)).for_engine("sglang")


def test_cluster_options_over_the_table():
    c = L.cluster_for(TABLE, gke=True, rdma=True, rdma_resource="rdma/rdma_shared_device_a",
                      nccl=(("NCCL_IB_GID_INDEX", "3"), ("NCCL_IB_HCA", "")))
    assert c.gke and c.rdma is not None
    assert c.rdma.resource == "rdma/rdma_shared_device_a"
    assert dict(c.rdma.env) == {"NCCL_IB_HCA": "", "NCCL_IB_GID_INDEX": "3",
                                "NCCL_SOCKET_IFNAME": "eth0"}
    assert L.cluster_for(TABLE) == L.Cluster()
    with pytest.raises(InputError, match="go with --rdma"):
        L.cluster_for(TABLE, nccl=(("NCCL_IB_HCA", "mlx5_0"),))
    with pytest.raises(InputError, match="not an extended resource name"):
        L.cluster_for(TABLE, rdma=True, rdma_resource="ib")


def test_the_host_s_launch_keeps_the_read_only_root_and_its_exec_tmpfs():
    from imgbuild.pipeline.run import launch_on_host

    for gpus in (True, False):
        launch, _notes = launch_on_host(_ro(_launch()), host_has_gpus=gpus, serving="m")
        a = launch.docker_args()
        assert "--read-only" in a and ("--tmpfs", "/tmp:rw,exec,nosuid,nodev") in set(zip(a, a[1:]))
        assert L.unwritable_dirs(launch) == []


def test_the_refusal_word_for_word_for_one_and_for_several_directories():
    one = _ro(L.with_env(_launch(), (("TRITON_CACHE_DIR", "/opt/triton"),), "--env"))
    with pytest.raises(InputError) as e:
        L.refuse_unwritable(one)
    assert e.value.hint == ("drop --env TRITON_CACHE_DIR, or point TRITON_CACHE_DIR under /tmp "
                            "with --env; or run without --read-only")
    # Two: one the image left on a read-only mount, one moved by --env; no tmpfs, no rw mount.
    two = L.with_env(_launch(volumes=(("/h/ckpt", "/models/m", "ro"),)),
                     (("HF_HOME", "/models/m/hf"), ("TVM_FFI_CACHE_DIR", "/opt/tvm")), "a profile")
    two = L.read_only(two, ())
    bad = [t for t in L.unwritable_dirs(two) if t.env in ("HF_HOME", "TVM_FFI_CACHE_DIR")]
    with pytest.raises(InputError) as e:
        L.refuse_unwritable(two, how="in this pod", bad=bad)
    assert e.value.message == ("cannot run imgbuild-m in this pod: 2 directories the server "
                               "writes would be read-only")
    assert e.value.facts == [
        "TVM_FFI_CACHE_DIR=/opt/tvm (set by a profile) lies on the read-only root",
        "HF_HOME=/models/m/hf (set by a profile) lies on the read-only mount /models/m",
        "writable in the container: nothing", "nothing was started"]
    assert e.value.hint == "point TVM_FFI_CACHE_DIR, HF_HOME under a writable mount"
    # Given no directories, there is nothing to refuse.
    L.refuse_unwritable(two, bad=[])


def test_a_root_only_reason_is_one_line_of_at_most_300_characters():
    launch = _ro(_launch(root_only="writes\n   beside " + "x" * 400, target="t"))
    with pytest.raises(InputError) as e:
        L.refuse_unwritable(launch, how="read-only")
    assert e.value.facts == ["target t: smoke.root_only: " + ("writes beside " + "x" * 400)[:300],
                             "nothing was started"]
    assert e.value.hint == "run it without --read-only"
    assert e.value.message.startswith("cannot run imgbuild-m read-only: ")
