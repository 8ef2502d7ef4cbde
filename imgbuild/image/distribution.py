"""The Distribution API over HTTP, spoken as Docker speaks it.

- TLS: a registry's CA from Docker's `/etc/docker/certs.d/HOST[:PORT]/ca.crt`, else
  IMGBUILD_CA_BUNDLE, else the system's CA bundle. Plain HTTP only to loopback (as Docker does)
  or to a host named in IMGBUILD_INSECURE_REGISTRIES / `--insecure-registry`.
- Credentials: where `docker login` put them (DOCKER_CONFIG or ~/.docker/config.json: `auths`,
  `credsStore`, `credHelpers` through the docker-credential-* helpers), read with the docker
  SDK's own lookup (docker.auth), never printed.
- The challenge: a 401's WWW-Authenticate says how. Basic: the credential. Bearer: a token from
  the realm for `repository:PATH:ACTIONS` (with the credential, or anonymously where the
  registry allows anonymous pulls), kept per scope for the life of the client and fetched
  again when the registry refuses it (expired).
"""

from __future__ import annotations

import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import docker.auth
import docker.errors
import requests
import urllib3
from docker.utils.config import find_config_file

from ..errors import EnvError

CERTS_D = Path("/etc/docker/certs.d")
SYSTEM_CA = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt")
TIMEOUT = (10, 120)


@dataclass(frozen=True)
class Credential:
    username: str
    secret: str  # a password or an identity token
    source: str  # where it was found, for messages (never the secret itself)

    def __repr__(self) -> str:  # nothing that prints a Credential prints the secret
        return f"Credential({self.username!r}, source={self.source!r})"


def credential_for(host: str) -> Credential | None:
    """The credential Docker would use for `host`, or None when there is none."""
    path = find_config_file()
    try:
        config = docker.auth.load_config(path)
        auth = docker.auth.resolve_authconfig(config, host)
    except docker.errors.DockerException as e:  # a credential helper that fails or is missing
        raise EnvError(f"cannot read the credentials for {host}",
                       facts=[f"{path or '~/.docker/config.json'}: {str(e).splitlines()[0][:200]}"],
                       hint="check the docker-credential-* helper your Docker config names, "
                            f"or `docker login {host}` again") from None
    if not auth:
        return None
    user = auth.get("username") or auth.get("Username") or ""
    secret = auth.get("password") or auth.get("Password") or auth.get("IdentityToken") or ""
    if not secret:
        return None
    store = config.get_credential_store(host)
    source = (f"{path} (credential helper docker-credential-{store})" if store
              else str(path or "~/.docker/config.json"))
    return Credential(user, secret, source)


def ca_for(host: str) -> str | bool:
    """What `requests` verifies a host's certificate with."""
    d = CERTS_D / host
    if (d / "ca.crt").is_file():
        return str(d / "ca.crt")
    for var in ("IMGBUILD_CA_BUNDLE", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"):
        if os.environ.get(var) and Path(os.environ[var]).is_file():
            return os.environ[var]
    return next((c for c in SYSTEM_CA if Path(c).is_file()), True)


def insecure_hosts() -> set[str]:
    return {h.strip() for h in os.environ.get("IMGBUILD_INSECURE_REGISTRIES", "").split(",")
            if h.strip()}


def _challenge(header: str) -> tuple[str, dict[str, str]]:
    scheme, _, rest = header.partition(" ")
    return scheme.lower(), dict(re.findall(r'(\w+)="([^"]*)"', rest))


def token_query(params: dict[str, str], scope: str | None) -> dict[str, str | list[str]]:
    """The token service's query for a Bearer challenge's `params`: its service, and the scope
    this request needs (else the one the challenge names; none where neither does)."""
    query: dict[str, str | list[str]] = {"service": params.get("service", "")}
    if scope or params.get("scope"):
        # Several scopes (a mount: push here, pull there) are several `scope` parameters.
        words = (scope or params["scope"]).split()
        query["scope"] = words[0] if len(words) == 1 else words
    return query


def scope_words(scope: str | None) -> tuple[str, str]:
    """(the actions, the repository path) a token scope `repository:PATH:ACTIONS` asks for, as
    a refusal says them ("access", "it" where the scope does not say)."""
    wants = (scope or "").rpartition(":")[2] or "access"
    path = (scope or "").split(":")[1] if (scope or "").count(":") >= 2 else "it"
    return wants, path


class Client:
    """Requests to one registry host, with its TLS and its challenge answered.

    plain_http_allowed: the host is loopback or named insecure. As Docker does there, HTTPS is
    tried first; a certificate this machine does not trust is accepted, and plain HTTP used
    when the host does not speak TLS. Every other host is HTTPS, verified."""

    def __init__(self, host: str, *, plain_http_allowed: bool = False):
        self.host, self.plain_http_allowed = host, plain_http_allowed
        self._base: str | None = None
        self._verify_tls = True
        self.session = requests.Session()
        self.tokens: dict[str, str] = {}  # scope -> bearer token
        self._credential: tuple[Credential | None] | None = None

    @property
    def credential(self) -> Credential | None:
        if self._credential is None:
            self._credential = (credential_for(self.host),)
        return self._credential[0]

    def request(self, method: str, path: str, *, scope: str | None = None,
                **kw) -> requests.Response:
        """`path` below /v2/ (or a URL the registry gave, such as an upload's Location);
        scope: the token scope a Bearer challenge is answered with."""
        url = path if path.startswith(("http://", "https://")) else (
            self.base_url + path if path.startswith("/") else f"{self.base_url}/v2/{path}")
        headers = dict(kw.pop("headers", None) or {})
        kw.setdefault("timeout", TIMEOUT)
        kw.setdefault("allow_redirects", True)
        for attempt in range(2):
            token = self.tokens.get(scope or "")
            auth_headers = {"Authorization": f"Bearer {token}"} if token else {}
            r = self._send(method, url, headers | auth_headers,
                           auth=self._basic if self._basic and not token else None, **kw)
            if r.status_code != 401 or attempt:
                break
            how, params = _challenge(r.headers.get("WWW-Authenticate", ""))
            if how == "bearer":
                self.tokens[scope or ""] = self._token(params, scope)
            elif how == "basic":
                if self.credential is None:
                    break
                self.tokens.pop(scope or "", None)
                self._basic = (self.credential.username, self.credential.secret)
            else:
                break
        if r.status_code == 401:
            if self.tokens.get(scope or "") and self.credential is not None:
                # The token service took the credential and issued a token the registry still
                # refuses: the account lacks the access the scope asks for.
                raise self._not_granted(scope)
            raise self._refused()
        return r

    _basic: tuple[str, str] | None = None

    @property
    def base_url(self) -> str:
        if self._base is None:
            self._base = f"https://{self.host}"
            if self.plain_http_allowed:
                try:
                    self.session.get(f"https://{self.host}/v2/", timeout=(3, 10),
                                     verify=ca_for(self.host))
                except requests.exceptions.SSLError as e:
                    # TLS spoken, the certificate not trusted, or no TLS at all (plain HTTP on
                    # the port): tell them apart as Docker does, by trying without checking.
                    self._verify_tls = False
                    try:
                        with warnings.catch_warnings():
                            warnings.simplefilter("ignore",
                                                  urllib3.exceptions.InsecureRequestWarning)
                            self.session.get(f"https://{self.host}/v2/", timeout=(3, 10),
                                             verify=False)
                    except requests.RequestException:
                        self._base, self._verify_tls = f"http://{self.host}", True
                    del e
                except requests.ConnectionError:
                    self._base = f"http://{self.host}"
        return self._base

    def ping(self):
        """GET /v2/ as is: 200, or 401 with the challenge (no credential is sent)."""
        return self._send("GET", f"{self.base_url}/v2/", {}, timeout=(5, 30))

    def _send(self, method: str, url: str, headers: dict, **kw) -> requests.Response:
        host = urlsplit(url).netloc
        verify = ca_for(host) if (self._verify_tls or host != self.host) else False
        try:
            with warnings.catch_warnings():  # verify=False only for a loopback/insecure host
                warnings.simplefilter("ignore", urllib3.exceptions.InsecureRequestWarning)
                return self.session.request(method, url, headers=headers, verify=verify, **kw)
        except requests.exceptions.SSLError as e:
            raise EnvError(f"registry {host} does not present a certificate this machine trusts",
                           facts=[f"{type(e).__name__}: {str(e)[:200]}"],
                           hint=f"put its CA in {CERTS_D / host / 'ca.crt'} (Docker reads it "
                                "too) or in IMGBUILD_CA_BUNDLE") from None
        except requests.RequestException as e:
            raise EnvError(f"registry {self.host} is unreachable",
                           facts=[f"{type(e).__name__}: {str(e)[:200]}"],
                           hint=f"start it, or check the registry name ({self.host})") from None

    def _token(self, params: dict[str, str], scope: str | None) -> str:
        realm = params.get("realm")
        if not realm:
            raise EnvError(f"registry {self.host} asks for a token but names no realm")
        query = token_query(params, scope)
        cred = self.credential
        try:
            r = self.session.get(realm, params=query, timeout=TIMEOUT,
                                 verify=ca_for(urlsplit(realm).netloc),
                                 auth=(cred.username, cred.secret) if cred else None)
        except requests.RequestException as e:
            raise EnvError(f"the token service of registry {self.host} is unreachable",
                           facts=[f"{realm}: {type(e).__name__}: {str(e)[:160]}"]) from None
        if r.status_code in (401, 403):
            raise self._refused(token_service=realm)
        if r.status_code != 200:
            raise EnvError(f"the token service of registry {self.host} answered {r.status_code}",
                           facts=[f"{realm}: {r.text[:200]}"])
        doc = r.json()
        token = doc.get("token") or doc.get("access_token")
        if not token:
            raise EnvError(f"the token service of registry {self.host} gave no token")
        return token

    def _not_granted(self, scope: str | None) -> EnvError:
        cred = self.credential
        who = f"user '{cred.username}'" if cred else "anonymous access"
        wants, path = scope_words(scope)
        return EnvError(f"registry {self.host} refused {wants} on {path} to {who}: the token "
                        "it was given does not grant it",
                        facts=[f"the credential comes from {cred.source}" if cred else
                               "no credential is configured for it"],
                        hint=f"`docker login {self.host}` with an account that may "
                             f"{wants.replace(',', ' and ')} there")

    def _refused(self, token_service: str | None = None) -> EnvError:
        cred = self.credential
        where = f" (token service {token_service})" if token_service else ""
        if cred is None:
            return EnvError(f"registry {self.host} asks for credentials{where}, and none are "
                            "configured for it",
                            facts=[f"looked in {find_config_file() or '~/.docker/config.json'}"],
                            hint=f"`docker login {self.host}`, then run the command again")
        return EnvError(f"registry {self.host} refused the credentials for user "
                        f"'{cred.username}'{where}",
                        facts=[f"they come from {cred.source}"],
                        hint=f"`docker login {self.host}` with the right password or token, "
                             "then run the command again")
