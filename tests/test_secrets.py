"""No secret reaches a place it can leak from. A target takes its heavy package, one of its
own, from a private index that asks for a password (a Basic-auth gate in front of pypiserver, on
an address the build container reaches); the spec names it as `http://probe:SECRET@HOST/simple/`.
The build also gets the host's netrc (a token for pypi.org) and a CA bundle with a private CA
(what a TLS-inspecting proxy needs), as a user behind one sets them; PyPI comes through the
host's mirror (UV_INDEX_URL, behind the same password), and everything through the host's proxy
(HTTP(S)_PROXY, with a password of its own). The lock and the build (every install step run:
--no-cache) work, and neither SECRET, nor the token, nor the proxy's
password, nor the private CA is in any of: the image's history, its inspect document, the
`docker save` tarball (every layer), the build log, `plan --json`, the Bake file, the
lockfile.

The target is tiny-cpu's shape without torch and its smoke model: the heavy install step, the
rest and every secret mount are the same, and the build is a minute of CPU less (torch from
nothing, its layer compressed and saved; `make test` budgets its CPU). The private index's
torch, the smoke checkpoint and their layers are tiny-cpu's, built in the other docker tests."""

from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import socket
import socketserver
import subprocess
import sys
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import requests

from .conftest import ROOT
from .registries import free_port
from .wheelfactory import LocalIndex, WheelSpec

pytestmark = pytest.mark.docker


def host_address() -> str | None:
    """An address of this machine that a container reaches (not loopback)."""
    out = subprocess.run(["hostname", "-I"], capture_output=True, text=True).stdout.split()
    return next((a for a in out if a.count(".") == 3 and not a.startswith("127.")), None)


class Gate:
    """HTTP Basic auth in front of a local index: 401 without the password, else forwarded."""

    def __init__(self, upstream: str, user: str, password: str, addr: str):
        self.seen: list[tuple[str, bool]] = []
        want = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        gate = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _forward(self, method: str) -> None:
                ok = self.headers.get("Authorization") == want
                gate.seen.append((self.path, ok))
                if not ok:
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Basic realm="private"')
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                headers = {k: self.headers[k] for k in ("Range", "Accept") if k in self.headers}
                # Bytes as they are: the length forwarded is the length sent.
                headers["Accept-Encoding"] = "identity"
                r = requests.request(method, upstream + self.path, headers=headers, stream=True,
                                     allow_redirects=False, timeout=60)
                self.send_response(r.status_code)
                for k in ("Content-Type", "Content-Length", "Location", "Content-Range",
                          "Accept-Ranges", "ETag", "Last-Modified"):
                    if k in r.headers:
                        self.send_header(k, r.headers[k])
                self.end_headers()
                if method == "GET":
                    for chunk in r.iter_content(1 << 20):
                        self.wfile.write(chunk)

            def do_GET(self):
                self._forward("GET")

            def do_HEAD(self):
                self._forward("HEAD")

        self.port = free_port()
        self.server = ThreadingHTTPServer((addr, self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Proxy:
    """An HTTP proxy that asks for a password (407 without it): CONNECT tunnels for https,
    absolute-URI requests forwarded for http, each recorded as (client address, method,
    target, authorised)."""

    def __init__(self, user: str, password: str, addr: str):
        self.seen: list[tuple[str, str, str, bool]] = []
        want = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        proxy = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self):
                first = self.rfile.readline().decode("latin-1")
                if not first.strip():
                    return
                method, target, _ = first.split(" ", 2)
                headers = []
                while (h := self.rfile.readline()) not in (b"\r\n", b"\n", b""):
                    headers.append(h)
                auth = next((h.split(b":", 1)[1].strip().decode() for h in headers
                             if h.lower().startswith(b"proxy-authorization:")), None)
                ok = auth == want
                proxy.seen.append((self.client_address[0], method, target, ok))
                if not ok:
                    self.wfile.write(b"HTTP/1.1 407 Proxy Authentication Required\r\n"
                                     b"Proxy-Authenticate: Basic realm=\"proxy\"\r\n"
                                     b"Content-Length: 0\r\nConnection: close\r\n\r\n")
                    return
                if method == "CONNECT":
                    host, port = target.rsplit(":", 1)
                    upstream = socket.create_connection((host, int(port)), timeout=60)
                    self.wfile.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                else:
                    u = urlsplit(target)
                    upstream = socket.create_connection((u.hostname, u.port or 80), timeout=60)
                    # One request per connection: the client reconnects for the next.
                    kept = [h for h in headers
                            if not h.lower().startswith((b"proxy-", b"connection:"))]
                    path = u.path + (f"?{u.query}" if u.query else "")
                    upstream.sendall(f"{method} {path} HTTP/1.1\r\n".encode() + b"".join(kept)
                                     + b"Connection: close\r\n\r\n")
                self.wfile.flush()
                _pipe(self.connection, upstream)

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self.port = free_port()
        self.server = Server((addr, self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _pipe(a: socket.socket, b: socket.socket) -> None:
    """Bytes both ways until either side closes."""
    def one(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(1 << 16):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s_ in (src, dst):
                try:
                    s_.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    t = threading.Thread(target=one, args=(b, a), daemon=True)
    t.start()
    one(a, b)
    t.join(timeout=60)
    b.close()


# tiny-cpu's shape (tiny-cpu.yaml): its engine, base and flavor, a heavy package and another
# from an index of their own (URL: the private one, with its password), the rest from PyPI. The
# heavy one is named as NVIDIA's private-index packages are, `nvidia-…`: the lock puts it in
# the heavy install step (lock/lockfile.py HEAVY_PREFIXES), which torch has in tiny-cpu.
TINY_SECRET = """\
description: The demo's shape, its heavy package from a private index.
engine:
  name: transformers
  version: "5.17.0"
archs: [cpu]
os: debian-bookworm
flavor: slim
requirements:
  - nvidia-imgbuild-probe==1.0
  - imgbuild-probe==1.0
  - safetensors
indexes:
  - name: private
    url: URL
    packages: [nvidia-imgbuild-probe, imgbuild-probe]
"""


def private_ca(tmp_path: Path) -> tuple[Path, list[bytes]]:
    """The host bundle plus a freshly made CA certificate: public roots are in certifi anyway,
    a private CA (what corporate proxies need) is what must never land in a layer. Returns the
    bundle and three lines of the new certificate's base64."""
    key, crt = tmp_path / "ca.key", tmp_path / "ca.crt"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", f"/CN=imgbuild-test-{uuid.uuid4().hex[:8]}", "-keyout", str(key),
                    "-out", str(crt)], check=True, capture_output=True)
    bundle = tmp_path / "bundle.crt"
    bundle.write_bytes(Path("/etc/ssl/certs/ca-certificates.crt").read_bytes() + crt.read_bytes())
    lines = [ln for ln in crt.read_bytes().splitlines() if len(ln) == 64]
    return bundle, lines[3:6]


def test_index_credentials_reach_the_build_as_a_secret_only(tmp_path, registry_repo,
                                                             docker_client):
    addr = host_address()
    if addr is None:
        pytest.skip("skipped: this machine has no non-loopback IPv4 address for the build")
    secret = "s3cr3t-" + secrets.token_hex(6)
    token = f"imgbuild-secret-{uuid.uuid4().hex}"
    netrc = tmp_path / "netrc"
    netrc.write_text(f"machine pypi.org login __token__ password {token}\n")
    bundle, ca_lines = private_ca(tmp_path)
    assert len(ca_lines) == 3
    hidden = [secret.encode(), token.encode(), *ca_lines]
    ix = LocalIndex(tmp_path / "index")
    ix.add(WheelSpec("imgbuild-probe", "1.0", files={"imgbuild_probe/__init__.py": "X = 1\n"}))
    ix.add(WheelSpec("nvidia-imgbuild-probe", "1.0",
                     files={"nvidia_imgbuild_probe/__init__.py": "X = 1\n"}))
    ix.start()
    gate = Gate(ix.url.removesuffix("/simple/"), "probe", secret, addr)
    # The host's PyPI mirror (UV_INDEX_URL), behind the same password: a firewall that
    # reaches only its mirrors. Lock and build must both ask it, not pypi.org.
    mirror = Gate("https://pypi.org", "probe", secret, addr)
    # ... and the way out is a proxy that asks for a password of its own.
    proxy_secret = "pr0xy-" + secrets.token_hex(6)
    hidden.append(proxy_secret.encode())
    proxy = Proxy("px", proxy_secret, addr)
    try:
        images = tmp_path / "images"
        shutil.copytree(ROOT / "images", images)
        shutil.copytree(ROOT / "lockfiles", tmp_path / "lockfiles")
        url = f"http://probe:{secret}@{addr}:{gate.port}/simple/"
        (images / "tiny-secret.yaml").write_text(TINY_SECRET.replace("URL", url))
        logs = tmp_path / "logs"
        logs.mkdir()
        env = {k: v for k, v in os.environ.items() if k != "IMGBUILD_WHEELS"}
        env |= {"UV_PYTHON_DOWNLOADS": "never", "HF_HUB_OFFLINE": "1",
                "IMGBUILD_NETRC": str(netrc), "IMGBUILD_CA_BUNDLE": str(bundle),
                "UV_INDEX_URL": f"http://probe:{secret}@{addr}:{mirror.port}/simple/",
                "HTTP_PROXY": f"http://px:{proxy_secret}@{addr}:{proxy.port}",
                "HTTPS_PROXY": f"http://px:{proxy_secret}@{addr}:{proxy.port}",
                "NO_PROXY": "127.0.0.1,localhost"}  # the registry is reached directly
        for k in ("http_proxy", "https_proxy", "no_proxy", "ALL_PROXY", "all_proxy"):
            env.pop(k, None)
        env.pop("UV_DEFAULT_INDEX", None)
        loc = ["--images", str(images)]

        def imgbuild(*args: str) -> subprocess.CompletedProcess:
            r = subprocess.run([sys.executable, "-m", "imgbuild.cli", *args, *loc], cwd=ROOT,
                               env=env, capture_output=True, text=True, timeout=1800)
            said = (r.stdout + r.stderr).encode()
            assert not any(h in said for h in hidden), args
            return r

        r = imgbuild("lock", "tiny-secret")
        assert r.returncode == 0, r.stderr[-3000:]
        lock_text = next((tmp_path / "lockfiles").glob("tiny-secret.*.txt")).read_text()
        assert "\nimgbuild-probe==1.0" in lock_text and "nvidia-imgbuild-probe==1.0" in lock_text
        assert any(ok and p == "/simple/safetensors/" for p, ok in mirror.seen), mirror.seen[:5]
        plan = imgbuild("plan", "tiny-secret", "--no-checks", "--json", "--registry",
                        registry_repo)
        assert plan.returncode == 0, plan.stderr[-2000:]
        assert f"http://{addr}:{gate.port}/simple/" in json.loads(plan.stdout)["extra_index_urls"]
        bake = imgbuild("matrix", "--format", "bake")
        assert bake.returncode == 0 and "tiny-secret" in bake.stdout, bake.stderr[-2000:]
        # A runner building from the Bake file installs from the same mirror.
        assert f"--default-index http://{addr}:{mirror.port}/simple/" in bake.stdout
        before, before_mirror, before_proxy = len(gate.seen), len(mirror.seen), len(proxy.seen)
        r = imgbuild("tiny-secret", "--registry", registry_repo, "--no-cache", "--json",
                     "--log-dir", str(logs))
        # --json: the error is the report on stdout (its message and facts), the progress on
        # stderr. Both are checked above to hold no secret.
        assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
        built = json.loads(r.stdout)
        # No smoke model, no smoke test: it runs the image with no network and no secret.
        assert built["action"] == "built" and built["smoke"] is None, built["smoke"]
        # The build asked the private index, and it let the build in: the netrc secret worked.
        assert any(ok and p.endswith(".whl") for p, ok in gate.seen[before:]), gate.seen[-5:]
        # Every install step ran with the secrets mounted: the heavy package through the gate,
        # the rest from PyPI through the bundle with the netrc.
        log = "".join(p.read_text() for p in logs.iterdir())
        assert "+ nvidia-imgbuild-probe==1.0" in log and "+ imgbuild-probe==1.0" in log
        assert "+ safetensors==" in log
        heavy = subprocess.run(["docker", "run", "--rm", "--entrypoint", "cat",
                                built["content_tag"], "/opt/imgbuild/heavy.txt"],
                               capture_output=True, text=True, check=True).stdout
        assert "nvidia-imgbuild-probe==1.0" in heavy and "safetensors" not in heavy, heavy
        # ... and those from PyPI through the host's mirror, its password from the netrc.
        assert any(ok and p == "/simple/safetensors/" for p, ok in mirror.seen[before_mirror:])
        # The build's uv went through the host's proxy, with its password: requests that
        # came from a container (not this machine's own address) and were let through.
        from_builds = [(m, t) for c, m, t, ok in proxy.seen[before_proxy:]
                       if ok and c not in (addr, "127.0.0.1")]
        assert (("GET", f"http://{addr}:{mirror.port}/simple/safetensors/") in from_builds
                ), proxy.seen[before_proxy:][:8]
        ref = built["content_tag"]
        history = subprocess.run(["docker", "history", "--no-trunc", ref], capture_output=True,
                                 text=True, check=True).stdout
        assert "IMGBUILD_INDEX_FLAGS" in history  # the build argument is there, without it
        assert f"--default-index http://{addr}:{mirror.port}/simple/" in history
        inspect = subprocess.run(["docker", "image", "inspect", ref], capture_output=True,
                                 text=True, check=True).stdout
        saved = tmp_path / "image.tar"
        subprocess.run(["docker", "save", "-o", str(saved), ref], check=True)
        places = {"history": history, "inspect": inspect, "lock": lock_text,
                  "plan --json": plan.stdout, "bake": bake.stdout,
                  "build log": "".join(p.read_text() for p in logs.iterdir())}
        assert places["build log"]
        leaked = [k for k, v in places.items() if any(h in v.encode() for h in hidden)]
        assert leaked == []
        # Every byte of every layer (the tarball holds each layer's tar as it is stored).
        blob = saved.read_bytes()
        assert b"imgbuild_probe/__init__.py" in blob  # the scan does see installed files
        assert [h for h in hidden if h in blob] == []
    finally:
        gate.stop()
        mirror.stop()
        proxy.stop()
        ix.stop()
        for t in docker_client.images.list(name=registry_repo):
            for tag in t.tags:
                if "tiny-secret" in tag:
                    docker_client.images.remove(tag, force=True)


def test_credentials_are_no_input_of_a_lock():
    from imgbuild.lock.lockfile import LockRequest

    a = LockRequest("t", "3.11", "x86_64-manylinux_2_36", ("x",), (),
                    ("https://u:one@idx.example/simple/",))
    b = LockRequest("t", "3.11", "x86_64-manylinux_2_36", ("x",), (),
                    ("https://u:two@idx.example/simple/",))
    c = LockRequest("t", "3.11", "x86_64-manylinux_2_36", ("x",), (),
                    ("https://other.example/simple/",))
    assert a.inputs_hash() == b.inputs_hash() != c.inputs_hash()
