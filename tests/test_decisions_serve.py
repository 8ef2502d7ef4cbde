"""The transformers images' small OpenAI-style server (payload/serve.py): its routes, the model
id it answers to, the completion length it allows. Plain data; the server running in an image
is tests/test_run.py's."""

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
