"""doctor against a corpus of server logs modelled on public reports (tests/fixtures/corpus).

Each log is reconstructed from one public SGLang, vLLM, FlashInfer or llm-compressor issue (its
index entry names it) in that report's shape: its engine and version, its log prefixes,
container prefixes and colour codes, its cut edges, and the failure's own wording as the
engine's releases print it. Its `family` is the cause the report's thread established, mapped
to a catalog id, or `outside` when the catalog has no such failure. A few `synthetic-` logs
cover catalog failures no public report was found for.

Scored per family: a certain diagnosis of the family is a true positive; "possibly" and
"a known sentence with another cause" are not positives. The table is printed after the run.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import yaml

from imgbuild.catalog.failures import load_failures
from imgbuild.checks import doctor

from .conftest import ROOT, SUMMARIES

CORPUS = ROOT / "tests" / "fixtures" / "corpus"
FAILURES = load_failures(ROOT / "images")
INDEX = yaml.safe_load((CORPUS / "index.yaml").read_text())
KNOWN = {fp.id for fp in FAILURES.fingerprints}


def _diagnose(path: Path):
    found: list = []
    with doctor.open_log(str(path)) as (lines, _):
        diags = doctor.diagnose(lines, FAILURES, found)
    return diags, found[0]


def score() -> dict:
    tp, fp, fn = Counter(), Counter(), Counter()
    outside_fp, wrong_engine, possible, per_file = [], [], 0, []
    for e in INDEX:
        want = {e["family"]} if e["family"] != "outside" else set()
        diags, engine = _diagnose(CORPUS / e["file"])
        got = {d.id for d in diags if d.id != doctor.OTHER_CAUSE and d.certain}
        possible += sum(not d.certain for d in diags)
        for f in got & want:
            tp[f] += 1
        for f in got - want:
            fp[f] += 1
            if not want:
                outside_fp.append((e["file"], f))
        for f in want - got:
            fn[f] += 1
        if engine is not None and e["engine"] in ("sglang", "vllm") and engine.name != e["engine"]:
            wrong_engine.append((e["file"], engine.name, e["engine"]))
        per_file.append((e["file"], sorted(want), sorted(got)))
    return {"tp": tp, "fp": fp, "fn": fn, "outside_fp": outside_fp,
            "wrong_engine": wrong_engine, "possible": possible, "files": per_file}


def _ratio(a: int, b: int) -> str:
    return f"{a / b:.2f}" if b else "-"


def test_the_corpus_is_what_its_index_says():
    files = {p.name for p in CORPUS.glob("*.log")}
    assert files == {e["file"] for e in INDEX}
    assert len(INDEX) >= 40
    for e in INDEX:
        assert e["family"] == "outside" or e["family"] in KNOWN, e
        assert e["modelled_on"].startswith(("https://github.com/", "none", "provoked here")), e
        # A log printed here by the Docker Engine says how, so that it can be printed again.
        assert (e["modelled_on"] == "provoked here") == ("provoked_with" in e), e
        if "provoked_with" in e:
            assert e["file"].startswith("provoked-") and e["provoked_with"].startswith(
                "docker run "), e


def test_precision_and_recall_per_family():
    s = score()
    tp, fp, fn = s["tp"], s["fp"], s["fn"]
    lines = [f"{'family':36} {'logs':>4} {'tp':>3} {'fp':>3} {'fn':>3} {'precision':>9} "
             f"{'recall':>6}"]
    families = sorted(set(tp) | set(fp) | set(fn))
    for f in families:
        n = tp[f] + fn[f]
        lines.append(f"{f:36} {n:>4} {tp[f]:>3} {fp[f]:>3} {fn[f]:>3} "
                     f"{_ratio(tp[f], tp[f] + fp[f]):>9} {_ratio(tp[f], tp[f] + fn[f]):>6}")
    T, F, N = sum(tp.values()), sum(fp.values()), sum(fn.values())
    outside = sum(1 for e in INDEX if e["family"] == "outside")
    lines.append(f"{'all catalog families':36} {T + N:>4} {T:>3} {F:>3} {N:>3} "
                 f"{_ratio(T, T + F):>9} {_ratio(T, T + N):>6}")
    lines.append(f"logs outside the catalog: {outside}, false positives there: "
                 f"{len(s['outside_fp'])}; 'possibly' answers: {s['possible']}; "
                 f"engine named wrongly: {len(s['wrong_engine'])}")
    misses = [f"  {name}: wanted {want or 'nothing'}, got {got or 'nothing'}"
              for name, want, got in s["files"] if set(want) != set(got)]
    SUMMARIES.append(("doctor corpus (tests/fixtures/corpus)", lines + misses))
    assert T / (T + F) >= 0.9 and T / (T + N) >= 0.9, "\n".join(lines + misses)
    assert s["outside_fp"] == [], s["outside_fp"]
    assert s["wrong_engine"] == [], s["wrong_engine"]
