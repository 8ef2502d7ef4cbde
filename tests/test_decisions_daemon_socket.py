"""image/daemon.py's own Engine client, without an Engine: an HTTP server on a unix socket in
this process answers as the Engine API does (GET /images/NAME/json, POST
/images/ID/tag?repo=&tag=&force=). What is decided: an image is looked up by its name quoted as
the docker SDK quotes it; a plain success is answered here, anything else (not there, an error,
an answer that is not an image) is handed to the SDK, which answers as it always did; a tag is
201 or the SDK's; a reload asks again.

The same client against real Engines is in tests/test_engines.py."""

from __future__ import annotations

import http.server
import json
import socketserver
import threading
from pathlib import Path

import pytest

from imgbuild.image import daemon

IMAGE = {"Id": "sha256:" + "a" * 64, "RepoTags": ["127.0.0.1:5000/acme:t-1"],
         "Config": {"Labels": {"io.imgbuild.target": "tiny-cpu"}}}


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


@pytest.fixture()
def engine(tmp_path, monkeypatch):
    """A socket answering as the Engine: `answers` maps (method, path) to (status, body)."""
    asked: list[tuple[str, str]] = []
    heard: list[dict[str, str]] = []  # each request's headers
    answers: dict[tuple[str, str], tuple[int, bytes]] = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def _answer(self):
            asked.append((self.command, self.path))
            heard.append(dict(self.headers))
            status, body = answers.get((self.command, self.path.split("?")[0]),
                                       (404, b'{"message":"No such image"}'))
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer

        def address_string(self):
            return "unix"

        def log_message(self, *a):
            pass

    sock = str(tmp_path / "docker.sock")
    server = _Server(sock, Handler)
    threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True).start()
    sdk_calls: list = []

    class SDKImages:
        def get(self, name):
            sdk_calls.append(("get", name))
            return "the SDK's image"

        def list(self):
            sdk_calls.append(("list",))
            return []

    class SDKApi:
        def tag(self, image, repository, tag=None, **kw):
            sdk_calls.append(("tag", image, repository, tag, kw))
            return "the SDK's answer"

    class SDK:
        images, api = SDKImages(), SDKApi()
        version = staticmethod(lambda: {"Version": "29.0.0"})

    monkeypatch.setattr(daemon, "sdk_client", SDK)
    e = daemon.Engine(sock)
    e.asked, e.answers, e.sdk_calls, e.heard = asked, answers, sdk_calls, heard
    yield e
    server.shutdown()
    server.server_close()


def test_an_image_here_is_read_from_the_socket_by_its_quoted_name(engine):
    engine.answers[("GET", "/images/127.0.0.1:5000/acme:t%201/json")] = (
        200, json.dumps(IMAGE).encode())
    img = engine.images.get("127.0.0.1:5000/acme:t 1")
    assert (img.id, img.labels, img.attrs) == (IMAGE["Id"], IMAGE["Config"]["Labels"], IMAGE)
    assert engine.sdk_calls == []  # the socket answered: the SDK is not even made


@pytest.mark.parametrize("status, body", [
    (404, b'{"message":"No such image"}'), (500, b"{}"), (200, b"not json"),
    (200, b'{"Id": ""}'), (200, b"[]")])
def test_anything_but_an_image_is_the_sdks_to_answer(engine, status, body):
    engine.answers[("GET", "/images/x/json")] = (status, body)
    assert engine.images.get("x") == "the SDK's image"
    assert engine.sdk_calls == [("get", "x")]


def test_an_image_without_labels_has_none(engine):
    engine.answers[("GET", "/images/x/json")] = (200, json.dumps(
        {"Id": "sha256:b", "Config": {"Labels": None}}).encode())
    assert engine.images.get("x").labels == {}
    engine.answers[("GET", "/images/x/json")] = (200, b'{"Id": "sha256:b"}')
    assert engine.images.get("x").labels == {}


def test_a_tag_is_the_engines_201_else_the_sdks(engine):
    engine.answers[("GET", "/images/x/json")] = (200, json.dumps(IMAGE).encode())
    img = engine.images.get("x")
    engine.answers[("POST", f"/images/{IMAGE['Id']}/tag")] = (201, b"")
    assert img.tag("127.0.0.1:5000/acme", "t-2") is True
    assert engine.asked[-1] == ("POST", f"/images/{IMAGE['Id']}/tag?tag=t-2&"
                                        "repo=127.0.0.1%3A5000%2Facme&force=0")
    assert img.tag("r", force=True) is True  # no tag: latest, as the SDK leaves it to the Engine
    assert engine.asked[-1] == ("POST", f"/images/{IMAGE['Id']}/tag?repo=r&force=1")
    assert engine.sdk_calls == []
    engine.answers[("POST", f"/images/{IMAGE['Id']}/tag")] = (409, b"{}")
    assert img.tag("r", "t") == "the SDK's answer"
    # an argument this client does not speak goes to the SDK whole
    assert img.tag("r", "t", other=1) == "the SDK's answer"
    assert engine.sdk_calls[-1] == ("tag", IMAGE["Id"], "r", "t", {"other": 1})


def test_a_reload_asks_again_and_the_rest_is_the_sdks(engine):
    engine.answers[("GET", "/images/x/json")] = (200, json.dumps(IMAGE).encode())
    img = engine.images.get("x")
    newer = IMAGE | {"RepoTags": ["r:new"]}
    engine.answers[("GET", f"/images/{IMAGE['Id']}/json")] = (200, json.dumps(newer).encode())
    img.reload()
    assert img.attrs == newer
    assert engine.images.list() == [] and engine.version() == {"Version": "29.0.0"}
    assert ("list",) in engine.sdk_calls


def test_after_a_reload_the_sdks_image_is_asked_for_again(engine):
    engine.answers[("GET", "/images/x/json")] = (200, json.dumps(IMAGE).encode())
    img = engine.images.get("x")
    engine.answers[("GET", f"/images/{IMAGE['Id']}/json")] = (200, json.dumps(IMAGE).encode())
    assert img.upper() == "THE SDK'S IMAGE"  # the SDK's Image's own attribute
    assert img.upper() and engine.sdk_calls.count(("get", IMAGE["Id"])) == 1  # kept
    img.reload()
    assert img.upper() == "THE SDK'S IMAGE" and \
        engine.sdk_calls.count(("get", IMAGE["Id"])) == 2  # asked again after the reload


def test_an_object_half_made_says_what_it_lacks_and_never_makes_the_sdk(monkeypatch):
    # copy, pickle and hasattr look for attributes on an object __init__ has not filled (or
    # for dunders): each is an AttributeError naming it, never a trip to the SDK (which would
    # reach for the Engine, or recurse through the attribute it lacks).
    monkeypatch.setattr(daemon, "sdk_client", lambda: pytest.fail("the SDK was made"))
    for cls, names in ((daemon.Engine, ("path", "_sdk", "images", "__deepcopy__")),
                       (daemon._Images, ("_engine", "__len__")),
                       (daemon._Image, ("_engine", "attrs", "_sdk_image", "__iter__"))):
        bare = cls.__new__(cls)
        for name in names:
            with pytest.raises(AttributeError) as e:
                getattr(bare, name)
            assert e.value.args == (name,), (cls, name)
    engine = daemon.Engine("/nonexistent/docker.sock")
    assert not hasattr(engine, "__iter__") and not hasattr(engine.images, "__len__")
    import copy

    assert copy.copy(engine).path == "/nonexistent/docker.sock"


def test_a_socket_no_one_answers_is_the_sdks_to_say(tmp_path, monkeypatch):
    monkeypatch.setattr(daemon, "sdk_client", lambda: type("SDK", (), {"images": type(
        "I", (), {"get": staticmethod(lambda name: f"the SDK on {name}")})()})())
    e = daemon.Engine(str(Path(tmp_path) / "nothing.sock"))
    assert e.images.get("x") == "the SDK on x"


# --- which Engine is asked on its socket, and which docker client builds ----------------------
# (moved from tests/test_engine_socket.py, which needs an Engine for the rest: this needs none)

def test_where_the_sdk_would_use_another_engine_it_is_the_sdk(monkeypatch, tmp_path):
    # A Docker CLI context other than the default, or TLS: the socket is not assumed.
    for var in ("DOCKER_HOST", "DOCKER_CONTEXT", "DOCKER_CONFIG", "DOCKER_TLS_VERIFY",
                "DOCKER_CERT_PATH"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert daemon.local_socket() == daemon.DEFAULT_SOCKET  # no config at all: the default
    monkeypatch.setenv("DOCKER_CONTEXT", "elsewhere")
    assert daemon.local_socket() is None
    monkeypatch.setenv("DOCKER_CONTEXT", "default")
    assert daemon.local_socket() == daemon.DEFAULT_SOCKET
    monkeypatch.delenv("DOCKER_CONTEXT")
    # the CLI's current context, from the first config that exists: DOCKER_CONFIG's, then
    # ~/.docker/config.json, then ~/.dockercfg
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / ".dockercfg").write_text('{"currentContext": "rootless"}')
    assert daemon.local_socket() is None
    (tmp_path / "home" / ".docker").mkdir()
    (tmp_path / "home" / ".docker" / "config.json").write_text('{"auths": {}}')
    assert daemon.local_socket() == daemon.DEFAULT_SOCKET  # the first one found decides
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    (tmp_path / "config.json").write_text('{"currentContext": "desktop-linux"}')
    assert daemon.local_socket() is None
    (tmp_path / "config.json").write_text('{"currentContext": "default"}')
    assert daemon.local_socket() == daemon.DEFAULT_SOCKET
    (tmp_path / "config.json").write_text("{not json")  # the SDK takes the default too
    assert daemon.local_socket() == daemon.DEFAULT_SOCKET
    monkeypatch.setenv("DOCKER_HOST", "tcp://127.0.0.1:2375")
    assert daemon.local_socket() is None
    monkeypatch.setenv("DOCKER_HOST", "unix://run/relative.sock")
    assert daemon.local_socket() is None
    monkeypatch.setenv("DOCKER_HOST", "unix:///run/other.sock")
    assert daemon.local_socket() == "/run/other.sock"
    monkeypatch.setenv("DOCKER_CERT_PATH", str(tmp_path))
    assert daemon.local_socket() is None
    monkeypatch.delenv("DOCKER_CERT_PATH")
    monkeypatch.setenv("DOCKER_TLS_VERIFY", "")  # set at all: the SDK asks for TLS
    assert daemon.local_socket() is None


def test_no_daemon_on_the_socket_is_the_sdks_error(monkeypatch, tmp_path):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path / 'none.sock'}")
    with pytest.raises(daemon.EnvError) as e:
        daemon.client()
    assert e.value.message == f"no Docker daemon answers at unix://{tmp_path / 'none.sock'}"
    assert e.value.hint == daemon.DAEMON_HINT and e.value.facts


def _docker(tmp_path: Path, name: str, version: str, buildx: bool) -> str:
    """A docker client that says its version and answers `buildx version` or not."""
    p = tmp_path / name
    p.write_text("#!/bin/sh\n"
                 f'[ "$1" = version ] && {{ echo "{version}"; exit 0; }}\n'
                 f'[ "$1 $2" = "buildx version" ] && exit {0 if buildx else 1}\n'
                 "exit 2\n")
    p.chmod(0o755)
    return str(p)


@pytest.fixture()
def clients(monkeypatch):
    found: list[str] = []
    monkeypatch.setattr(daemon, "candidates", lambda: found)
    daemon.cli.cache_clear()
    yield found
    daemon.cli.cache_clear()


def test_the_client_that_builds_is_20_10_as_it_is_or_a_newer_one_with_buildx(clients, tmp_path):
    old = _docker(tmp_path, "old", "20.10.24+dfsg1", buildx=False)
    new = _docker(tmp_path, "new", "26.1.5", buildx=True)
    bare = _docker(tmp_path, "bare", "29.0.1", buildx=False)
    silent = _docker(tmp_path, "silent", "", buildx=False)  # runs, but says no version
    clients[:] = [silent, bare, new, old]
    assert daemon.cli() == daemon.DockerCLI(new, "26.1.5", False)  # hands builds to buildx
    daemon.cli.cache_clear()
    clients[:] = [bare, old, new]
    assert daemon.cli() == daemon.DockerCLI(old, "20.10.24+dfsg1", True)  # BuildKit built in
    daemon.cli.cache_clear()
    # 23.0 handed builds to buildx: a 23 client without the plugin cannot build either
    v23 = _docker(tmp_path, "v23", "23.0.6", buildx=False)
    clients[:] = [v23, bare, silent]
    with pytest.raises(daemon.EnvError) as e:
        daemon.cli()
    assert e.value.message == "no docker client that can run BuildKit builds"
    assert e.value.facts == [f"{v23} (client 23.0.6: needs the buildx plugin, which is missing)",
                             f"{bare} (client 29.0.1: needs the buildx plugin, which is missing)",
                             f"{silent} (client ?: needs the buildx plugin, which is missing)"]
    assert "docker.io" in e.value.hint and "IMGBUILD_DOCKER=" in e.value.hint
    daemon.cli.cache_clear()
    clients[:] = []
    with pytest.raises(daemon.EnvError) as e:
        daemon.cli()
    assert e.value.facts == ["no docker client found on PATH"]


def test_a_client_version_is_its_first_line_and_none_when_it_does_not_run(tmp_path):
    assert daemon.client_version(_docker(tmp_path, "d", "27.3.1", buildx=True)) == "27.3.1"
    assert daemon.client_version(str(tmp_path / "missing")) is None


def test_the_client_is_the_socket_s_own_when_the_engine_answers_its_ping(engine, monkeypatch):
    for var in ("DOCKER_CONTEXT", "DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("DOCKER_HOST", f"unix://{engine.path}")
    engine.answers[("GET", "/_ping")] = (200, b"OK")
    c = daemon.client()
    assert isinstance(c, daemon.Engine) and c.path == engine.path
    assert engine.asked == [("GET", "/_ping")]
    # As the SDK sends it: no body, said so, to the host name the Engine ignores.
    assert engine.heard[0]["Content-Length"] == "0" and engine.heard[0]["Host"] == "docker"
    engine.answers[("GET", "/_ping")] = (500, b"OK")
    assert not isinstance(daemon.client(), daemon.Engine)  # the SDK's client, and its reason


def test_a_connection_to_the_socket_keeps_its_timeout(engine):
    conn = daemon._UnixConnection(engine.path, 7.5)
    conn.connect()
    try:
        assert conn.sock.gettimeout() == 7.5
    finally:
        conn.close()


def test_no_daemon_at_the_default_socket_is_said_with_the_sdk_s_first_line(monkeypatch):
    import docker
    from docker.errors import DockerException

    def refuse(**kw):
        raise DockerException("Error while fetching server API version: " + "x" * 300
                              + "\nsecond line")

    monkeypatch.setattr(docker, "from_env", refuse)
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    with pytest.raises(daemon.EnvError) as e:
        daemon.sdk_client()
    assert e.value.message == "no Docker daemon answers at unix:///var/run/docker.sock"
    assert e.value.facts == [("Error while fetching server API version: " + "x" * 300)[:200]]


def test_the_clients_tried_are_the_chosen_one_debian_s_then_the_path_s(monkeypatch, tmp_path):
    there = {str(tmp_path / "mine"), "/usr/bin/docker", str(tmp_path / "bin" / "docker")}
    monkeypatch.setattr(daemon.os.path, "exists", lambda p: p in there)
    monkeypatch.setattr(daemon.shutil, "which", lambda _n: str(tmp_path / "bin" / "docker"))
    monkeypatch.setenv("IMGBUILD_DOCKER", str(tmp_path / "mine"))
    assert daemon.candidates() == [str(tmp_path / "mine"), "/usr/bin/docker",
                                   str(tmp_path / "bin" / "docker")]
    monkeypatch.delenv("IMGBUILD_DOCKER")
    there.discard("/usr/bin/docker")
    assert daemon.candidates() == [str(tmp_path / "bin" / "docker")]


def test_the_client_runs_with_what_its_builder_and_a_clean_up_need(clients, tmp_path,
                                                                   monkeypatch):
    """DOCKER_BUILDKIT=1 for a 20.10 client (its BuildKit is off by default), and
    IMGBUILD_CLEANUP=1 for a command that must finish while imgbuild is stopped."""
    p = tmp_path / "docker"
    p.write_text('#!/bin/sh\n[ "$1" = version ] && { echo "$V"; exit 0; }\n'
                 '[ "$1 $2" = "buildx version" ] && exit 0\n'
                 'echo "args=$* buildkit=${DOCKER_BUILDKIT-unset} '
                 'cleanup=${IMGBUILD_CLEANUP-unset} mine=${MINE-unset}"\n')
    p.chmod(0o755)
    clients[:] = [str(p)]
    for var in ("DOCKER_BUILDKIT", "IMGBUILD_CLEANUP"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("V", "20.10.24+dfsg1")
    monkeypatch.setenv("MINE", "kept")  # the caller's environment goes on as it is
    out = daemon.run_cli(["ps", "-a"], capture_output=True, text=True).stdout
    assert out == "args=ps -a buildkit=1 cleanup=unset mine=kept\n"
    out = daemon.run_cli(["rm", "x"], cleanup=True, capture_output=True, text=True).stdout
    assert out == "args=rm x buildkit=1 cleanup=1 mine=kept\n"
    daemon.cli.cache_clear()
    monkeypatch.setenv("V", "27.3.1")
    out = daemon.run_cli(["ps"], capture_output=True, text=True).stdout
    assert out == "args=ps buildkit=unset cleanup=unset mine=kept\n"
    assert daemon.cli_command(["build", "."]) == [str(p), "build", "."]


def test_a_local_image_is_asked_for_by_its_reference():
    asked = []

    class Images:
        def get(self, ref):
            asked.append(ref)
            return "image"

    assert daemon.local_image(type("C", (), {"images": Images()})(), "r/x:1") == "image"
    assert asked == ["r/x:1"]
