"""How a Sigstore trusted_root.json is read (image/keyless.py load_trust_root), on Sigstore's
own public-good file (tests/data/sigstore, recorded real data, its README says where from):
every authority and log with its name, key id, hash and validity window as the file gives
them, and each way a file can be unusable named word for word, with where in the file. Also
the DER string a Fulcio certificate carries its issuer in."""

from __future__ import annotations

import base64
import copy
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from imgbuild.image import keyless

PGI = Path(__file__).parent / "data" / "sigstore" / "trusted_root_pgi.json"
TYPE = "application/vnd.dev.sigstore.trustedroot+json;version=0.1"


@pytest.fixture(scope="module")
def doc() -> dict:
    return json.loads(PGI.read_bytes())


def test_sigstores_public_root_is_read_as_the_file_gives_it():
    root = keyless.load_trust_root(PGI.read_bytes(), "pgi.json")
    assert root.source == "pgi.json"
    assert [(c.name, c.organization, c.common_name, c.uri, str(c.valid), len(c.chain),
             c.chain[0].subject.rfc4514_string()) for c in root.cas] == [
        ("sigstore.dev/sigstore", "sigstore.dev", "sigstore", "https://fulcio.sigstore.dev",
         "2021-03-07T03:20:29Z to 2022-12-31T23:59:59Z", 1, "CN=sigstore,O=sigstore.dev"),
        ("sigstore.dev/sigstore", "sigstore.dev", "sigstore", "https://fulcio.sigstore.dev",
         "2022-04-13T20:06:15Z to -", 2, "CN=sigstore-intermediate,O=sigstore.dev")]
    assert [(t.name, t.key_id.hex()[:16], t.hash_algorithm, str(t.valid))
            for t in root.tlogs] == [
        ("https://rekor.sigstore.dev", "c0d23d6ad406973f", "SHA2_256", "2021-01-12T11:53:27Z to -")]
    assert [(t.name, t.key_id.hex()[:16], t.hash_algorithm, str(t.valid))
            for t in root.ctlogs] == [
        ("https://ctfe.sigstore.dev/test", "086092f02852ff68", "SHA2_256",
         "2021-03-14T00:00:00Z to 2022-10-31T23:59:59Z"),
        ("https://ctfe.sigstore.dev/2022", "dd3d306ac6c71132", "SHA2_256", "2022-10-20T00:00:00Z to -")]
    assert root.cas[0].valid.start == datetime(2021, 3, 7, 3, 20, 29, tzinfo=UTC)


def test_what_a_file_leaves_out_is_empty_or_open_not_invented(doc):
    d = copy.deepcopy(doc)
    ca = d["certificateAuthorities"][1]
    del ca["subject"], ca["uri"], ca["validFor"]
    log = d["tlogs"][0]
    del log["baseUrl"], log["hashAlgorithm"], log["publicKey"]["validFor"]
    root = keyless.load_trust_root(json.dumps(d).encode(), "x")
    # No subject: named by the first certificate of its chain (the issuer of a leaf).
    c = root.cas[1]
    assert (c.name, c.organization, c.common_name, c.uri) == (
        "CN=sigstore-intermediate,O=sigstore.dev", "", "", "")
    assert (c.valid.start, c.valid.end) == (None, None)
    t = root.tlogs[0]
    assert (t.name, t.hash_algorithm, t.valid.start, t.valid.end) == ("", "", None, None)
    ca["subject"] = {"commonName": "only-cn"}
    assert keyless.load_trust_root(json.dumps(d).encode(), "x").cas[1].name == "only-cn"


def _problem(d: object) -> str:
    with pytest.raises(keyless.TrustRootProblem) as e:
        keyless.load_trust_root(json.dumps(d).encode() if not isinstance(d, bytes) else d, "x")
    return str(e.value)


def test_each_unusable_file_is_named_with_where_in_it(doc):
    assert _problem(b"{").startswith("not JSON: Expecting property name")
    assert _problem([1]) == f"mediaType is None, not {TYPE}"
    assert _problem({"mediaType": "application/json"}) == (
        f"mediaType is 'application/json', not {TYPE}")
    assert _problem({}) == f"mediaType is None, not {TYPE}"
    assert _problem({"mediaType": TYPE}) == (
        "no certificateAuthorities: nothing a keyless certificate can chain to")

    def broken(change) -> str:
        d = copy.deepcopy(doc)
        change(d)
        return _problem(d)
    assert broken(lambda d: d["certificateAuthorities"][1].pop("certChain")) == (
        "certificateAuthorities[1]: no usable certChain.certificates (KeyError)")
    assert broken(lambda d: d["certificateAuthorities"][0]["certChain"].update(
        certificates=[{"rawBytes": base64.b64encode(b"not DER").decode()}])) == (
        "certificateAuthorities[0]: no usable certChain.certificates (ValueError)")
    assert broken(lambda d: d["certificateAuthorities"][0]["certChain"].update(
        certificates=[])) == "certificateAuthorities[0]: an empty certChain"
    assert broken(lambda d: d["certificateAuthorities"][1]["validFor"].update(
        start="yesterday")) == (
        "certificateAuthorities[1].validFor.start: 'yesterday' is not an RFC 3339 time")
    assert broken(lambda d: d["certificateAuthorities"][0]["validFor"].update(end="soon")) == (
        "certificateAuthorities[0].validFor.end: 'soon' is not an RFC 3339 time")
    assert broken(lambda d: d["tlogs"][0].pop("logId")) == (
        "tlogs[0]: no usable publicKey.rawBytes / logId.keyId (KeyError)")
    assert broken(lambda d: d["ctlogs"][1]["publicKey"].update(rawBytes="AAAA")) == (
        "ctlogs[1]: no usable publicKey.rawBytes / logId.keyId (ValueError)")
    assert broken(lambda d: d["ctlogs"][1]["publicKey"]["validFor"].update(start="x")) == (
        "ctlogs[1].publicKey.validFor.start: 'x' is not an RFC 3339 time")
    assert broken(lambda d: d["tlogs"][0]["publicKey"]["validFor"].update(end="x")) == (
        "tlogs[0].publicKey.validFor.end: 'x' is not an RFC 3339 time")


def test_the_issuer_extension_is_a_der_utf8_string_of_either_length_form():
    assert keyless._der_utf8(b"\x0c\x05hello") == "hello"
    long = "https://token.actions.githubusercontent.com/" + "x" * 150
    raw = long.encode()
    assert len(raw) > 127
    assert keyless._der_utf8(b"\x0c\x81" + bytes([len(raw)]) + raw + b"tail") == long
    assert keyless._der_utf8(b"\x0c\x82" + len(raw).to_bytes(2, "big") + raw) == long
    assert keyless._der_utf8(b"\x0c\x00") == ""
    assert keyless._der_utf8(b"\x0c") is None
    assert keyless._der_utf8(b"\x13\x05hello") is None  # a PrintableString is not UTF8String
    assert keyless._der_utf8(b"\x0c\x02\xff\xfe") == "\ufffd\ufffd"
