"""Which lock a build takes (image/buildlock.py), the cases tests/test_buildlock.py leaves
open: the Engine is DOCKER_HOST's where none is named, and the lock file names its holder only
while it is held. One process, no Engine."""

from __future__ import annotations

from imgbuild.image.buildlock import exclusive, lock_dir, lock_name


def test_the_lock_is_docker_hosts_engines_where_none_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "tcp://10.0.0.2:2376")
    with exclusive("sha256:eee", directory=tmp_path) as waited:
        assert not waited
        assert [p.name for p in tmp_path.iterdir()] == [lock_name("sha256:eee",
                                                                  "tcp://10.0.0.2:2376")]
    monkeypatch.delenv("DOCKER_HOST")
    with exclusive("sha256:fff", directory=tmp_path):
        assert (tmp_path / "sha256-fff.lock").exists()
    # Named, it is that Engine's whatever DOCKER_HOST says.
    monkeypatch.setenv("DOCKER_HOST", "tcp://10.0.0.2:2376")
    with exclusive("sha256:ggg", directory=tmp_path, docker_host="unix:///var/run/docker.sock"):
        assert (tmp_path / "sha256-ggg.lock").exists()


def test_the_holder_is_named_while_held_and_forgotten_after(tmp_path, monkeypatch):
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    path = tmp_path / lock_name("sha256:eee", None)
    with exclusive("sha256:eee", directory=tmp_path, docker_host=None):
        assert path.read_text().startswith("pid ")
    assert path.read_text() == ""


def test_the_locks_live_under_imgbuilds_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("IMGBUILD_CACHE", str(tmp_path))
    assert lock_dir() == tmp_path / "build-locks"
    monkeypatch.delenv("IMGBUILD_CACHE")  # unset: imgbuild's cache in the user's home
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert lock_dir() == tmp_path / "home" / ".cache" / "imgbuild" / "build-locks"
