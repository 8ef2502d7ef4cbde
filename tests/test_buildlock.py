"""One build per content key on a machine: a second waits (here: gives up), other keys don't."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from imgbuild.errors import EnvError
from imgbuild.image.buildlock import exclusive

HOLD = """
import sys, time
from pathlib import Path
from imgbuild.image.buildlock import exclusive
with exclusive(sys.argv[1], directory=Path(sys.argv[2]), log=lambda m: None):
    print("held", flush=True)
    time.sleep(float(sys.argv[3]))
"""


def _hold(key, tmp_path, seconds):
    p = subprocess.Popen([sys.executable, "-c", HOLD, key, str(tmp_path), str(seconds)],
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
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
