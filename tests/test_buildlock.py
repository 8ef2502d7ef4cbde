"""One build per content key on an Engine: a second waits (here: gives up), other keys and other
Engines do not."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from imgbuild.errors import EnvError
from imgbuild.image.buildlock import exclusive, lock_name

HOLD = """
import sys, time
from pathlib import Path
from imgbuild.image.buildlock import exclusive, lock_name
with exclusive(sys.argv[1], directory=Path(sys.argv[2]), log=lambda m: None):
    print("held", flush=True)
    time.sleep(float(sys.argv[3]))
"""


def _hold(key, tmp_path, seconds):
    p = subprocess.Popen([sys.executable, "-c", HOLD, key, str(tmp_path), str(seconds)],
                         stdout=subprocess.PIPE, text=True)
    said = p.stdout.readline().strip()
    if said != "held":  # reaped here, not left to whoever waits for any child later
        p.kill()
        p.wait()
    assert said == "held"
    return p


def test_same_key_waits_other_keys_do_not(tmp_path):
    holder = _hold("sha256:aaa", tmp_path, 30)
    try:
        said = []
        with pytest.raises(EnvError, match="gave up waiting"):
            with exclusive("sha256:aaa", directory=tmp_path, wait_s=1, log=said.append):
                pass
        assert said and "another imgbuild (pid " in said[0]
        t = time.monotonic()
        with exclusive("sha256:bbb", directory=tmp_path, wait_s=1) as waited:
            assert waited is False
        assert time.monotonic() - t < 1
    finally:
        holder.kill()
        holder.wait()
    # Released with its process: the key is free again, without waiting.
    with exclusive("sha256:aaa", directory=tmp_path, wait_s=1) as waited:
        assert waited is False


def test_waiter_proceeds_when_the_holder_finishes(tmp_path):
    holder = _hold("sha256:ccc", tmp_path, 1.5)
    try:
        with exclusive("sha256:ccc", directory=tmp_path, wait_s=30, log=lambda m: None) as waited:
            assert waited is True
    finally:
        holder.wait()


HOLD_ON = """
import sys, time
from pathlib import Path
from imgbuild.image.buildlock import exclusive, lock_name
with exclusive(sys.argv[1], directory=Path(sys.argv[2]), log=lambda m: None,
               docker_host=sys.argv[4]):
    print("held", flush=True)
    time.sleep(float(sys.argv[3]))
"""


def test_the_lock_is_the_engines_another_engine_builds_beside_it(tmp_path):
    # Two Engines on one machine (Engine 20.10 and an Engine 26 beside it): each holds its own
    # tags, so one's build of an image does not hold up the other's.
    a, b = "unix:///var/run/docker.sock", "unix:///run/imgbuild-engines/26/docker.sock"
    p = subprocess.Popen([sys.executable, "-c", HOLD_ON, "sha256:ddd", str(tmp_path), "30", a],
                         stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "held"
        with exclusive("sha256:ddd", directory=tmp_path, wait_s=1, docker_host=b) as waited:
            assert waited is False
        with pytest.raises(EnvError, match="gave up waiting"):
            with exclusive("sha256:ddd", directory=tmp_path, wait_s=1, docker_host=a):
                pass
    finally:
        p.kill()
        p.wait()


def test_lock_names_by_engine():
    # The default socket keeps the name locks had before there was more than one Engine.
    assert lock_name("sha256:eee", None) == lock_name("sha256:eee",
                                                      "unix:///var/run/docker.sock") \
        == "sha256-eee.lock"
    other = lock_name("sha256:eee", "tcp://10.0.0.2:2376")
    assert other.startswith("sha256-eee-") and other != lock_name("sha256:eee", "unix:///x")
