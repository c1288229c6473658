"""`prefixcache serve` in a subprocess: it serves, checks the key, stops on SIGINT."""

from __future__ import annotations

import signal
import socket
import subprocess
from pathlib import Path

import httpx
import openai
import pytest
from integration_helpers import CLI, subprocess_env
from typer.testing import CliRunner

from prefixcache.integrations.cli import build_app
from prefixcache.integrations.cli_serve import LogLevel
from prefixcache.integrations.server.server_process import free_port, wait_until_healthy


def test_serve_command_runs_a_keyed_server(tiny_chat_dir: Path) -> None:
    port = free_port()
    process = subprocess.Popen(
        [*CLI, "serve", "--model", str(tiny_chat_dir), "--port", str(port), "--dtype",
         "float32", "--num-blocks", "64", "--block-size", "4", "--served-model-name", "tiny",
         "--log-level", "warning", "--max-body-bytes", "4096"],
        env={**subprocess_env(), "PREFIXCACHE_API_KEY": "secret"},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        wait_until_healthy(process, base, 90)
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="secret", max_retries=0)
        reply = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
        assert reply.usage.completion_tokens == 3
        assert httpx.get(f"{base}/v1/models").status_code == 401
        too_big = httpx.post(f"{base}/v1/completions", timeout=30,
                             headers={"Authorization": "Bearer secret"},
                             json={"model": "tiny", "prompt": "x" * 5000, "max_tokens": 1})
        assert too_big.status_code == 413, too_big.text
        assert too_big.json()["error"]["code"] == "request_too_large"
    finally:
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr


def test_serve_rejects_a_missing_model(tmp_path: Path) -> None:
    result = CliRunner().invoke(build_app(), ["serve", "--model", str(tmp_path / "nothing")])
    assert result.exit_code == 2, result.output
    assert ("nothing" in result.output and result.exception is None) or \
        isinstance(result.exception, SystemExit)


def test_serve_rejects_an_unknown_device(tiny_chat_dir: Path) -> None:
    result = CliRunner().invoke(
        build_app(), ["serve", "--model", str(tiny_chat_dir), "--device", "tpu"]
    )
    assert result.exit_code == 2, result.output
    assert "unknown device 'tpu'" in result.output


def _model_must_not_load(monkeypatch) -> None:
    """Any attempt to build the engine fails the test: the check must come before it."""

    def refuse(**kwargs) -> None:
        raise AssertionError("the model loaded although an option was bad")

    monkeypatch.setattr("prefixcache.engine.async_llm.AsyncLLM", refuse)


def _one_line(output: str) -> str:
    assert "Traceback" not in output
    return " ".join(output.replace("│", " ").split())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--log-level", "nope"], "'nope' is not one of"),
        (["--host", "999.1.1.1"], "--host '999.1.1.1' does not resolve"),
        (["--kv-cache-dtype", "fp4"], "unknown --kv-cache-dtype 'fp4'"),
        (["--kv-tier-dtype", "fp16"], "unknown kv_tier_dtype 'fp16'"),
        (["--kv-cache-dtype", "fp8", "--kv-tier-dtype", "int8"], "needs a float KV pool"),
    ],
)
def test_serve_checks_options_before_loading_the_model(
    args: list[str], message: str, tiny_chat_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _model_must_not_load(monkeypatch)
    result = CliRunner().invoke(
        build_app(), ["serve", "--model", str(tiny_chat_dir), "--port", str(free_port()), *args]
    )
    assert result.exit_code == 2, result.output
    assert message in _one_line(result.output)


def test_serve_refuses_a_busy_port_before_loading_the_model(
    tiny_chat_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _model_must_not_load(monkeypatch)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = CliRunner().invoke(
            build_app(), ["serve", "--model", str(tiny_chat_dir), "--port", str(port)]
        )
    assert result.exit_code == 2, result.output
    assert f"cannot listen on 127.0.0.1 port {port}" in _one_line(result.output)


def test_serve_log_levels_are_uvicorns() -> None:
    from uvicorn.config import LOG_LEVELS

    assert [level.value for level in LogLevel] == list(LOG_LEVELS)


@pytest.mark.parametrize("error", [KeyError("rope_theta"), AttributeError("no attribute x"),
                                   NotImplementedError("quant type 23")])
def test_serve_reports_any_model_loading_error_as_one_message(
    error: Exception, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken_loader(**kwargs) -> None:
        raise error

    monkeypatch.setattr("prefixcache.engine.async_llm.AsyncLLM", broken_loader)
    result = CliRunner().invoke(
        build_app(), ["serve", "--model", str(tmp_path), "--port", str(free_port())]
    )
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit)
    assert f"did not load: {type(error).__name__}: " in _one_line(result.output)


def test_serve_refuses_a_hybrid_kv_cache_for_a_model_without_sliding_layers(
    tiny_chat_dir: Path,
) -> None:
    result = CliRunner().invoke(
        build_app(), ["serve", "--model", str(tiny_chat_dir), "--port", str(free_port()),
                      "--hybrid-kv-cache", "--num-blocks", "32"]
    )
    assert result.exit_code == 2, result.output
    assert "hybrid_kv_cache needs a model with sliding-window layers" in _one_line(result.output)
