"""What each refusal says, as reviewed: the message, the chain of facts, the way out and the
exit code, for bad input a user types.

Every command here fails before it needs an Engine, a registry or the network (a dry run, an
emit into a directory that is then checked to be absent, a check of the catalog). Each runs
in-process, as `imgbuild ... --json` does, and its JSON error document is compared with
tests/golden/refusals.json (`make golden` records it after a change meant to change one).
A refusal reworded, a fact dropped or an exit code changed is seen in review.
"""

from __future__ import annotations

import json
from pathlib import Path

from . import golden

# (argv, what it refuses); run from an empty scratch directory, so relative paths in them
# (an --emit directory) name nothing of the machine.
CASES: tuple[tuple[tuple[str, ...], str], ...] = (
    (("run", "k2.7", "--dry-run"), "neither a target nor a model profile"),
    (("run", "k2.6", "--model", "tiny-nvfp4", "--dry-run"), "a model and another --model"),
    (("run", "sglang-blackwell", "--model", "k2.6", "--dry-run", "--read-only",
      "-e", "HF_HOME=/root/hf"), "a cache moved onto the read-only root"),
    (("run", "tiny-cpu", "--dry-run", "-e", "NOEQUALS"), "an --env without NAME=VALUE"),
    (("run", "tiny-cpu", "--emit", "k8s", "out", "--rdma-resource", "rdma/ib"),
     "RDMA options without --rdma"),
    (("run", "tiny-cpu", "--emit", "k8s", "out", "--rdma", "--rdma-resource", "BAD"),
     "not an extended resource name"),
    (("run", "tiny-cpu", "--emit", "k8s", "out", "--admission", "kyverno"),
     "an admission policy with no signing policy"),
    (("run", "tiny-cpu", "--emit", "k8s", "out", "--gpus-per-node", "0"),
     "no GPUs per node"),
    (("plan", "no-such"), "an unknown target"),
    (("plan", "tiny-cpu", "--model", "no-such"), "an unknown model"),
    (("plan", "tiny-cpu", "--arch", "sm99"), "an unknown arch"),
    (("lock", "no-such"), "lock: an unknown target"),
    (("check-model", "x"), "check-model without a target"),
    (("doctor", "--engine", "nope", "log.txt"), "doctor: an engine it does not know"),
    (("doctor", "--engine", "sglang==x.y", "log.txt"), "doctor: not a version"),
    (("index", "tiny-cpu", "--registry", "127.0.0.1:5000/x"),
     "index of a single-platform target"),
    (("matrix", "--changed-since", "0123456789" * 4), "matrix: a commit not in the checkout"),
)


def documents() -> dict[str, dict]:
    """Each case's exit code and JSON error document, by its command line."""
    out: dict[str, dict] = {}
    root = Path(__file__).resolve().parents[1]
    with golden.scratch("imgbuild-refusals-"):
        for argv, _what in CASES:
            # The checkout's catalog, named as the environment would (any directory).
            code, said, _err = golden.run_cli(
                [*argv, "--json", "--images", str(root / "images"), "--lockfiles",
                 str(root / "lockfiles")] if argv[0] != "doctor" else [*argv, "--json"])
            doc = json.loads(said) if said.strip() else None
            out[" ".join(argv)] = {"exit_code": code, "error": doc}
            assert not Path("out").exists(), f"{argv}: a refusal wrote files"
    return out


def page() -> str:
    """The documents, the checkout's path written CHECKOUT (it is the machine's)."""
    root = str(Path(__file__).resolve().parents[1])
    return json.dumps(documents(), indent=1, ensure_ascii=False).replace(root, "CHECKOUT") + "\n"


def test_each_refusal_says_what_it_said_when_reviewed():
    got = {"refusals.json": page()}
    want = {"refusals.json": golden.REFUSALS.read_text()} if golden.REFUSALS.exists() else {}
    assert not (said := golden.differences(got, want, "refusals")), said


def test_every_case_is_a_refusal_with_a_way_out():
    for line, r in documents().items():
        assert r["exit_code"] in (2, 3), (line, r)
        assert r["error"] and r["error"]["message"], line
        assert r["error"].get("hint"), f"{line}: no way out"
