"""Record what the docker client returns when image/smoke.py runs the smoke payload in a real
image (the seam tests/test_decisions_image_smoke.py replays), so that the decisions `smoke.run`
makes on that output are tested without an Engine.

    .venv/bin/python tests/data/smoke/record.py IMAGE NAME [--as-root]

IMAGE: a tiny-cpu image (`make demo` builds one). Writes NAME.json here: the exact argv the
container ran with, its exit code, stdout and stderr, the image's labels and the Engine's
version. Needs a Docker Engine."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path

from imgbuild.image import daemon, smoke
from imgbuild.plan import render


def main(argv: list[str]) -> int:
    image, name = argv[0], argv[1]
    as_root = "--as-root" in argv
    calls: list[dict] = []
    real = smoke.run_container

    def recording(prefix: str, args: list[str], **kw):
        proc = real(prefix, args, **kw)
        calls.append({"args": args, "returncode": proc.returncode, "stdout": proc.stdout,
                      "stderr": proc.stderr})
        return proc

    smoke.run_container = recording
    smoke_args = ["--lock", f"{render.ASSETS}/lock.txt", "--model",
                  f"{render.ASSETS}/smoke-model", "--facts", f"{render.ASSETS}/image.json",
                  "--gpu", "auto", "--engine", "transformers"]
    smoke._as_any_user(image, "transformers", smoke_args, gpus=[], timeout=900, env=None,
                       as_root=as_root)
    image_id, _, labels = daemon.run_cli(
        ["image", "inspect", "--format", "{{.Id}} {{json .Config.Labels}}", image],
        capture_output=True, text=True).stdout.partition(" ")
    engine = daemon.run_cli(["version", "--format", "{{.Server.Version}}"],
                            capture_output=True, text=True).stdout.strip()
    [call] = calls
    doc = {"recorded": datetime.now(UTC).isoformat(timespec="seconds"), "engine": engine,
           "image_id": image_id, "image_labels": json.loads(labels), **call}
    out = Path(__file__).with_name(f"{name}.json")
    out.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(f"wrote {out} ({len(call['stdout'])} bytes of stdout, exit {call['returncode']})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
