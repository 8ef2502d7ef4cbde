"""Package index URLs as a spec may name them: with credentials (`https://user:secret@host/`).
The credentials are no input (they decide no byte of a lock or an image) and are never shown:
what is hashed, planned, logged and passed as a build argument is the URL without them; the
build gets them as a BuildKit secret (a netrc entry for the host)."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote, urlsplit, urlunsplit


@dataclass(frozen=True)
class IndexCredential:
    host: str
    login: str
    password: str

    def __repr__(self) -> str:
        return f"IndexCredential({self.host!r}, {self.login!r})"

    def netrc(self) -> str:
        return f"machine {self.host} login {self.login} password {self.password}\n"


def strip_credentials(url: str) -> str:
    """The URL without user or password."""
    p = urlsplit(url)
    if not (p.username or p.password):
        return url
    host = p.hostname or ""
    if ":" in host:  # IPv6
        host = f"[{host}]"
    if p.port:
        host += f":{p.port}"
    return urlunsplit(p._replace(netloc=host))


def redact(url: str) -> str:
    """The URL with its credentials shown as `***` (for messages: it says there were some)."""
    p = urlsplit(url)
    if not (p.username or p.password):
        return url
    return urlunsplit(p._replace(netloc="***@" + urlsplit(strip_credentials(url)).netloc))


def credential_of(url: str) -> IndexCredential | None:
    p = urlsplit(url)
    if not (p.username or p.password):
        return None
    return IndexCredential(p.hostname or "", unquote(p.username or ""),
                           unquote(p.password or ""))
