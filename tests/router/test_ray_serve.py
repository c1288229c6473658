"""prefixcache on Ray Serve: a local Ray instance, two tiny-model replicas behind the ingress,
routed by PrefixCacheRequestRouter. Sessions stay on one replica and their later turns hit;
answers equal an uncached engine's; streams and errors pass through."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from tiny_model_factory import make_tiny_model_dir

pytest.importorskip("ray.serve", reason="needs ray[serve]: pip install 'prefixcache[ray]'")

import ray
from ray import serve

from prefixcache.engine.llm import LLM
from prefixcache.engine.sampling_params import SamplingParams
from prefixcache.integrations.ray import prefixcache_app
from prefixcache.integrations.ray.replica import REPLICA_HEADER
from prefixcache.integrations.server.server_process import free_port

CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LLM_OPTIONS = {"dtype": "float32", "num_blocks": 512, "block_size": 4}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = make_tiny_model_dir(tmp_path_factory.mktemp("ray-model"), "llama",
                                 max_position_embeddings=2048)  # fmt: skip
    (folder / "chat_template.jinja").write_text(CHATML)
    return folder


@pytest.fixture(scope="module")
def serve_url(model_dir: Path) -> Iterator[str]:
    port = free_port()
    ray.init(num_cpus=4, include_dashboard=False, configure_logging=False,
             runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}})  # fmt: skip
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        app = prefixcache_app(model=str(model_dir), served_model_name="tiny", num_replicas=2,
                              llm=LLM_OPTIONS, routing_stats_period_s=0.2)  # fmt: skip
        serve.run(app, name="prefixcache", route_prefix="/")
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


def complete(url: str, prompt: list[int], session: str, **extra) -> httpx.Response:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 3, "temperature": 0,
            "user": session, **extra}  # fmt: skip
    return httpx.post(f"{url}/v1/completions", json=body, timeout=120)


def test_sessions_stay_on_one_replica_and_hit(serve_url: str, model_dir: Path) -> None:
    reference = LLM(str(model_dir), **LLM_OPTIONS)  # one engine alone gives the same answers
    landed: dict[str, set[str]] = {}
    for turn in range(3):
        for session in range(4):
            prompt = [(7 * session + k) % 300 + 20 for k in range(48 + 12 * turn)]
            response = complete(serve_url, prompt, f"s{session}")
            assert response.status_code == 200, response.text
            landed.setdefault(f"s{session}", set()).add(response.headers[REPLICA_HEADER])
            reply = response.json()
            expected = reference.generate([prompt], SamplingParams(max_tokens=3, temperature=0))[0]
            assert reply["choices"][0]["text"] == expected.text
            cached = reply["usage"]["prompt_tokens_details"]["cached_tokens"]
            assert (cached >= 48) if turn else True, (turn, session, cached)
    assert all(len(replicas) == 1 for replicas in landed.values()), landed
    stats = httpx.get(f"{serve_url}/router/stats", timeout=30).json()
    assert stats["policy"] == "cache_aware"
    replicas = stats["replicas"]  # each replica told where its KV events are: precise indexes
    assert len(replicas) == 2 and all(r["precise"] for r in replicas.values()), replicas
    used = set().union(*landed.values())
    assert all(replicas[r]["indexed_blocks"] > 0 for r in used), (replicas, used)


def test_streams_errors_and_models_pass_through(serve_url: str) -> None:
    body = {"model": "tiny", "prompt": list(range(30, 70)), "max_tokens": 4, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    with httpx.stream("POST", f"{serve_url}/v1/completions", json=body, timeout=120) as reply:
        assert reply.status_code == 200
        assert reply.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in reply.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    assert chunks[-1]["usage"]["completion_tokens"] == 4
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"])

    wrong = httpx.post(f"{serve_url}/v1/completions", json={"model": "other", "prompt": "x"},
                       timeout=60)  # fmt: skip
    assert wrong.status_code == 404 and wrong.json()["error"]["code"] == "model_not_found"
    malformed = httpx.post(f"{serve_url}/v1/chat/completions", content=b"{not json",
                           headers={"content-type": "application/json"}, timeout=60)  # fmt: skip
    assert malformed.status_code == 400, malformed.text
    models = httpx.get(f"{serve_url}/v1/models", timeout=60).json()
    assert models["data"][0]["id"] == "tiny"
    chat = httpx.post(f"{serve_url}/v1/chat/completions", timeout=120,
                      json={"model": "tiny", "max_tokens": 2,
                            "messages": [{"role": "user", "content": "hello there"}]})  # fmt: skip
    assert chat.status_code == 200 and chat.json()["usage"]["prompt_tokens"] > 3


def test_the_documented_serve_config_builds() -> None:
    import yaml

    from prefixcache.integrations.ray import RayAppOptions, build_app

    text = (Path(__file__).resolve().parents[2] / "docs" / "router.md").read_text()
    config = yaml.safe_load(text.split("```yaml\n", 1)[1].split("```", 1)[0])
    app = config["applications"][0]
    assert app["import_path"] == "prefixcache.integrations.ray:build_app"
    options = RayAppOptions.from_args(app["args"])
    assert (options.num_replicas, options.env["OMP_NUM_THREADS"]) == (4, "4")
    assert build_app(app["args"]) is not None  # the application graph, not deployed here
    assert RayAppOptions.from_args({"num_replicas": "3"}).num_replicas == 3
    for bad, message in (({"num_replicas": 0}, "num_replicas"), ({"policy": "best"}, "policy"),
                         ({"replicas": 2}, "unknown option")):  # fmt: skip
        with pytest.raises(ValueError, match=message):
            RayAppOptions.from_args(bad)
