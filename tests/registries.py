"""Real registries on this machine for the tests: the Distribution registry (docker-registry)
with htpasswd, with token auth and a token issuer of the tests' own, or with TLS. Keys and
certificates come from the openssl command; passwords are bcrypt-hashed with the C library's
crypt(3), as htpasswd -B would."""

from __future__ import annotations

import base64
import json
import secrets
import shutil
import socket
import ssl
import subprocess
import threading
import time
import uuid
import warnings
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import requests

with warnings.catch_warnings():  # crypt is deprecated in 3.11, and the one bcrypt hasher here
    warnings.simplefilter("ignore", DeprecationWarning)
    import crypt


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def openssl(*args: str, cwd: Path, data: bytes | None = None) -> bytes:
    r = subprocess.run(["openssl", *args], cwd=cwd, input=data, capture_output=True, check=True)
    return r.stdout


def make_ca(d: Path, cn: str, ip: str | None = None) -> tuple[Path, Path, Path]:
    """A CA and a server certificate it signs (for `ip` when given): (ca.crt, cert, key)."""
    d.mkdir(parents=True, exist_ok=True)
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
            "-days", "2", "-subj", f"/CN={cn} CA", cwd=d)
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
            "-subj", f"/CN={cn}", cwd=d)
    (d / "ext.cnf").write_text(f"subjectAltName=IP:{ip or '127.0.0.1'}\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "server.crt", "-days", "2", "-extfile", "ext.cnf", cwd=d)
    return d / "ca.crt", d / "server.crt", d / "server.key"


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@dataclass
class TokenIssuer:
    """The token service of Docker's token auth: Basic credentials in, a JWT (RS256, signed by
    openssl with a key whose certificate the registry trusts, sent in the x5c header) out,
    granting per account only the actions it may do."""

    root: Path
    accounts: dict[str, tuple[str, tuple[str, ...]]]  # user -> (password, actions)
    anonymous: tuple[str, ...] = ("pull",)
    service: str = "imgbuild-test-registry"
    issuer: str = "imgbuild-test-issuer"
    port: int = field(default_factory=free_port)
    asked: list[dict] = field(default_factory=list)
    lifetime: int = 300  # seconds a token is valid; below 0 gives tokens already expired
    tls: tuple[Path, Path] | None = None  # (certificate, key): the realm is https

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "sign.key", "-out",
                "sign.crt", "-days", "2", "-subj", "/CN=token signer", cwd=self.root)
        der = openssl("x509", "-in", "sign.crt", "-outform", "DER", cwd=self.root)
        self.x5c = base64.b64encode(der).decode()

    @property
    def realm(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}/token"

    def token(self, user: str | None, scope: str) -> str:
        granted = self.accounts[user][1] if user else self.anonymous
        access = []
        if scope:
            kind, name, actions = scope.split(":")
            access.append({"type": kind, "name": name,
                           "actions": [a for a in actions.split(",") if a in granted]})
        now = int(time.time())
        header = {"typ": "JWT", "alg": "RS256", "x5c": [self.x5c]}
        claims = {"iss": self.issuer, "sub": user or "", "aud": self.service, "exp": now + self.lifetime,
                  "nbf": now - 10, "iat": now, "jti": uuid.uuid4().hex, "access": access}
        signing = f"{b64url(json.dumps(header).encode())}.{b64url(json.dumps(claims).encode())}"
        sig = openssl("dgst", "-sha256", "-sign", "sign.key", cwd=self.root,
                      data=signing.encode())
        return f"{signing}.{b64url(sig)}"

    def start(self) -> TokenIssuer:
        issuer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                q = parse_qs(urlsplit(self.path).query)
                user = None
                auth = self.headers.get("Authorization", "")
                if auth.startswith("Basic "):
                    u, _, p = base64.b64decode(auth[6:]).decode().partition(":")
                    if u not in issuer.accounts or issuer.accounts[u][0] != p:
                        self.send_response(401)
                        self.end_headers()
                        return
                    user = u
                scope = (q.get("scope") or [""])[0]
                issuer.asked.append({"user": user, "scope": scope,
                                     "service": (q.get("service") or [None])[0]})
                body = json.dumps({"token": issuer.token(user, scope)}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        if self.tls:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(str(self.tls[0]), str(self.tls[1]))
            self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class Registry:
    root: Path
    auth: dict | None = None  # the `auth:` block
    tls: tuple[Path, Path] | None = None  # (certificate, key)
    addr: str = "127.0.0.1"
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None

    @property
    def host(self) -> str:
        return f"{self.addr}:{self.port}"

    def start(self) -> Registry:
        if shutil.which("docker-registry") is None:
            raise RuntimeError("docker-registry is not installed (make services installs it)")
        self.root.mkdir(parents=True, exist_ok=True)
        http: dict = {"addr": f"{'0.0.0.0' if self.addr != '127.0.0.1' else self.addr}:"
                              f"{self.port}"}
        if self.tls:
            http["tls"] = {"certificate": str(self.tls[0]), "key": str(self.tls[1])}
        cfg = {"version": 0.1, "log": {"level": "warn"},
               "storage": {"filesystem": {"rootdirectory": str(self.root / "data")},
                           "delete": {"enabled": True}},
               "http": http}
        if self.auth:
            cfg["auth"] = self.auth
        (self.root / "config.yml").write_text(json.dumps(cfg))  # JSON is YAML
        self.proc = subprocess.Popen(["docker-registry", "serve", str(self.root / "config.yml")],
                                     stdout=subprocess.DEVNULL, stderr=open(self.root / "log", "w"))
        scheme = "https" if self.tls else "http"
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with warnings.catch_warnings():  # only "is it up", not "is it trusted"
                    warnings.simplefilter("ignore")
                    requests.get(f"{scheme}://{self.host}/v2/", timeout=1, verify=False)
                return self
            except requests.RequestException:
                time.sleep(0.1)
        raise RuntimeError(f"registry did not start: {(self.root / 'log').read_text()[-500:]}")

    def wait_for_upload(self, pusher: subprocess.Popen, repository: str = "imgbuild",
                        timeout: float = 600) -> None:
        """Return once `pusher` has begun uploading a blob into `repository` here (an upload
        session on disk), while it is still running: the moment to interrupt a push."""
        uploads = self.root / "data" / "docker" / "registry" / "v2" / "repositories" / \
            repository / "_uploads"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and pusher.poll() is None:
            if uploads.is_dir() and any(uploads.iterdir()):
                break
            time.sleep(0.05)
        assert pusher.poll() is None, "the push ended before a layer upload was seen"

    def stop(self) -> None:
        if self.proc:
            self.proc.terminate()
            self.proc.wait(timeout=20)
            self.proc = None


def htpasswd(path: Path, users: dict[str, str]) -> Path:
    # bcrypt at cost 4 (2**4 rounds), the least it allows: Distribution checks the password
    # on every request, and at Python's default cost 12 (about 0.25 s a check here) a push of
    # tiny-cpu spent half a minute of a core in the registry. The cost is part of the hash, so
    # the registry reads it from the file; the auth path is the same.
    salt = crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=1 << 4)
    path.write_text("".join(f"{u}:{crypt.crypt(p, salt)}\n" for u, p in users.items()))
    return path


def docker_login(config: Path, host: str, user: str, password: str) -> None:
    """`docker login` as a user runs it: the Engine checks the credentials, the CLI stores them
    in config.json (base64, as it does without a credential helper)."""
    config.mkdir(parents=True, exist_ok=True)
    r = subprocess.run([shutil.which("docker", path="/usr/bin") or "docker", "--config",
                        str(config), "login", host, "-u", user,
                        "--password-stdin"], input=password, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"docker login {host} failed: {r.stderr}")


def write_docker_config(config: Path, host: str, user: str, password: str) -> None:
    """A config.json holding these credentials without asking the registry (a stale or wrong
    password, as a user's config can hold)."""
    config.mkdir(parents=True, exist_ok=True)
    auth = base64.b64encode(f"{user}:{password}".encode()).decode()
    (config / "config.json").write_text(json.dumps({"auths": {host: {"auth": auth}}}))


def random_password() -> str:
    return "pw-" + secrets.token_hex(8)
