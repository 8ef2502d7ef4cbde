"""A small OpenAI-style server for the transformers images (tiny-cpu): what `imgbuild run` starts
in an image whose engine is transformers, so the run path (start, phases, readiness, a request,
a clean stop) is exercised end to end on a machine with no GPU.

Standard library HTTP only; the model loads as the smoke test loads it (smoke.load_model:
compressed-tensors decompressed to bf16 on CPU). Endpoints: GET /health, GET /v1/models,
POST /v1/completions ({"prompt", "max_tokens"}: greedy). It prints the phase lines
images/launch.yaml watches for ("serve: loading weights", "serve: ready").
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

try:  # imgbuild.payload.serve, in the package
    from . import smoke as payload
except ImportError:  # /opt/imgbuild/serve.py, a script beside smoke.py in the image
    import smoke as payload  # type: ignore[no-redef]


def served_name(model: str, served_model_name: str | None) -> str:
    """The model id the server answers to: --served-model-name, else the checkpoint's name."""
    return served_model_name or Path(model).name


def max_new_tokens(body: dict[str, Any]) -> int:
    """A completion's max_tokens, 16 when not given, held to 1..256."""
    return max(1, min(int(body.get("max_tokens", 16)), 256))


def get_route(path: str, name: str) -> tuple[int, dict[str, Any]]:
    """(status, body) of a GET."""
    if path == "/health":
        return 200, {"status": "ok"}
    if path == "/v1/models":
        return 200, {"object": "list", "data": [
            {"id": name, "object": "model", "owned_by": "imgbuild"}]}
    return 404, {"error": f"no route {path}"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True,
                    help="a checkpoint directory, or a hub repo id (read through HF_HOME)")
    ap.add_argument("--served-model-name", default=None)
    ap.add_argument("--host", default="0.0.0.0")
    ap.add_argument("--port", type=int, default=8000)
    args = ap.parse_args(argv)
    name = served_name(args.model, args.served_model_name)
    print(f"serve: loading weights from {args.model}", flush=True)
    import torch
    from transformers import AutoTokenizer

    model, info = payload.load_model(Path(args.model))
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    print(f"serve: weights loaded in {info['load_s']} s", flush=True)
    lock = threading.Lock()  # one forward at a time: the model is not shared across threads

    def complete(body: dict[str, Any]) -> dict[str, Any]:
        prompt = str(body.get("prompt", ""))
        steps = max_new_tokens(body)
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        with lock, torch.no_grad():
            out = model.generate(ids, max_new_tokens=steps, do_sample=False)
        text = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
        return {"object": "text_completion", "model": name,
                "choices": [{"index": 0, "text": text, "finish_reason": "length"}],
                "usage": {"prompt_tokens": int(ids.shape[1]),
                          "completion_tokens": int(out.shape[1] - ids.shape[1])}}

    class Handler(BaseHTTPRequestHandler):
        def _send(self, code: int, doc: dict[str, Any]) -> None:
            data = json.dumps(doc).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            self._send(*get_route(self.path, name))

        def do_POST(self) -> None:  # noqa: N802
            if self.path != "/v1/completions":
                self._send(404, {"error": f"no route {self.path}"})
                return
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                self._send(200, complete(body))
            except (ValueError, TypeError) as e:
                self._send(400, {"error": str(e)})

        def log_message(self, fmt: str, *a: Any) -> None:
            print("serve: " + fmt % a, flush=True)

    server = ThreadingHTTPServer((args.host, args.port), Handler)
    print(f"serve: ready on port {args.port} ({name})", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
