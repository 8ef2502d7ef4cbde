"""What the any-user smoke stage reports (image/smoke.py), on plain data without an Engine:
the smoke check itself is the root run's and is left out; one failing check fails the stage
and is named; a root-only image is skipped, saying as whom the smoke test ran."""

from __future__ import annotations

from imgbuild.image import smoke


def test_the_any_user_stage_fails_on_any_check_and_names_it():
    doc = {"checks": [{"name": "smoke", "status": "fail", "reason": "root's"},
                      {"name": "tmp-exec", "status": "pass", "reason": ""},
                      {"name": "cache-writable", "status": "fail", "reason": "read-only /root"},
                      {"name": "versions", "status": "skipped", "reason": "no lock"}]}
    got = smoke._any_user_stage(doc)
    assert got["name"] == smoke.ANY_USER_STAGE and got["status"] == "fail"
    assert [c["name"] for c in got["checks"]] == ["tmp-exec", "cache-writable", "versions"]
    assert "cache-writable: read-only /root" in got["reason"]
    assert "versions: no lock" in got["reason"] and "tmp-exec" not in got["reason"]
    ok = smoke._any_user_stage({"checks": [{"name": "smoke", "status": "fail"},
                                           {"name": "a", "status": "pass"},
                                           {"name": "b", "status": "pass"}]})
    assert ok["status"] == "pass" and ok["reason"].endswith("2 checks passed")


def test_a_root_only_image_skips_the_stage_saying_who_ran():
    got = smoke._root_only_stage("x" * 1000, {"uid": 0, "gid": 0})
    assert got["status"] == "skipped" and got["checks"] == []
    assert "ran as uid 0 gid 0" in got["reason"] and "x" * 601 not in got["reason"]
    assert "uid ? gid ?" in smoke._root_only_stage("why", {})["reason"]
