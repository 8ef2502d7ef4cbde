"""The transformers images' small OpenAI-style server (payload/serve.py): its routes, the model
id it answers to, the completion length it allows; and the server itself, run in this process
on a generated checkpoint. The server running in an image is tests/test_run.py's."""

from __future__ import annotations


def test_the_transformers_server_answers_openai_style_routes():
    from imgbuild.payload.serve import get_route, max_new_tokens, served_name

    assert get_route("/health", "m") == (200, {"status": "ok"})
    assert get_route("/v1/models", "tiny") == (200, {"object": "list", "data": [
        {"id": "tiny", "object": "model", "owned_by": "imgbuild"}]})
    assert get_route("/nope", "m") == (404, {"error": "no route /nope"})
    assert served_name("/opt/models/tiny-nvfp4", None) == "tiny-nvfp4"
    assert served_name("/opt/models/tiny-nvfp4", "alias") == "alias"
    assert [max_new_tokens(b) for b in ({}, {"max_tokens": 0}, {"max_tokens": 999},
                                        {"max_tokens": "7"})] == [16, 1, 256, 7]


def test_the_server_serves_a_real_checkpoint_in_this_process(capsys):
    """main() on the generated smoke checkpoint (the real generator, on CPU), in a thread of
    this process: the phase lines images/launch.yaml watches for, the routes, a greedy
    completion of the asked length, a bad body refused with 400 and an unknown route 404."""
    import json
    import threading
    import urllib.error
    import urllib.request
    from http.server import ThreadingHTTPServer

    from imgbuild import smokemodel
    from imgbuild.payload import serve

    from .conftest import smoke_checkpoint

    # the checkpoint tests/test_checkmodel.py makes (same name, same cache area: made once)
    model = smoke_checkpoint(smokemodel.SmokeModelSpec(name="ckm-nvfp4", scheme="NVFP4"),
                             "checkmodel")
    servers: list[ThreadingHTTPServer] = []

    class Recorded(ThreadingHTTPServer):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            servers.append(self)

    serve.ThreadingHTTPServer = Recorded  # the module's name only: put back below
    try:
        t = threading.Thread(target=serve.main, args=(
            ["--model", str(model), "--served-model-name", "tiny", "--host", "127.0.0.1",
             "--port", "0"],), daemon=True)
        t.start()
        for _ in range(600):
            if servers:
                break
            t.join(0.1)
        [server] = servers
        base = f"http://127.0.0.1:{server.server_address[1]}"

        def ask(path, body=None):
            req = urllib.request.Request(base + path, data=None if body is None else body,
                                         method="GET" if body is None else "POST")
            try:
                with urllib.request.urlopen(req, timeout=60) as r:
                    return r.status, json.loads(r.read())
            except urllib.error.HTTPError as e:
                return e.code, json.loads(e.read())

        assert ask("/health") == (200, {"status": "ok"})
        assert ask("/v1/models")[1]["data"][0]["id"] == "tiny"
        code, done = ask("/v1/completions", json.dumps({"prompt": "hello", "max_tokens": 3})
                         .encode())
        assert code == 200 and done["model"] == "tiny" and done["object"] == "text_completion"
        assert done["usage"]["completion_tokens"] <= 3 and done["choices"][0]["index"] == 0
        assert ask("/v1/completions", b"{not json")[0] == 400
        assert ask("/v1/other", b"{}") == (404, {"error": "no route /v1/other"})
        server.shutdown()
        t.join(10)
        assert not t.is_alive() and t
    finally:
        serve.ThreadingHTTPServer = ThreadingHTTPServer
    said = capsys.readouterr().out.splitlines()
    assert said[0] == f"serve: loading weights from {model}"
    assert said[1].startswith("serve: weights loaded in ")
    assert said[2] == "serve: ready on port 0 (tiny)"
