"""`prefixcache bench` refuses bad input up front: exit 2, one message, no traceback, nothing
run and no file written or overwritten (output paths, model, engine options, URL, timeout,
vocabulary)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import TINY_VOCAB
from typer.testing import CliRunner

from prefixcache.integrations.bench.output_paths import check_output_dir, check_output_file
from prefixcache.integrations.bench.target_embedded import EmbeddedTarget
from prefixcache.integrations.cli import build_app
from prefixcache.integrations.cli_bench import _llm_kwargs

SMALL = [
    "--workload", "shared-prefix", "--groups", "1", "--prompts-per-group", "2",
    "--system-len", "32", "--question-len", "8", "--output-len", "2", "--no-progress",
    "--no-plots",
]
SENTINEL = "results of an earlier run\n"


def invoke(*args: str):
    return CliRunner().invoke(build_app(), ["bench", *args])


def one_message(result) -> str:
    """The output on one line (rich wraps the error box); checks there is no traceback."""
    assert "Traceback" not in result.output
    return " ".join(result.output.replace("│", " ").split())


@pytest.fixture
def never_started(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any embedded target that starts fails the test (the check must come first)."""

    async def refuse(self, warmup: bool = True) -> None:
        raise AssertionError("a target started although the input was bad")

    monkeypatch.setattr(EmbeddedTarget, "start", refuse)


@pytest.fixture
def earlier_results(tmp_path: Path) -> tuple[Path, Path]:
    """An output folder and a request list left by an earlier run."""
    out, saved = tmp_path / "out", tmp_path / "requests.jsonl"
    out.mkdir()
    for path in (out / "bench.json", out / "bench_requests.csv", saved):
        path.write_text(SENTINEL)
    return out, saved


def assert_untouched(out: Path, saved: Path) -> None:
    for path in (out / "bench.json", out / "bench_requests.csv", saved):
        assert path.read_text() == SENTINEL, f"{path} was overwritten"


# ------------------------------------------------------------------ engine options
def test_engine_options_pass_through_unless_unset() -> None:
    assert _llm_kwargs(num_blocks=0, dtype=None, device="") == {"num_blocks": 0, "device": ""}


# ------------------------------------------------------------------ output paths
def test_an_output_dir_under_a_file_is_refused_before_running(
    tmp_path: Path, never_started: None
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = invoke(*SMALL, "--output-dir", str(blocker / "x"))
    assert result.exit_code == 2, result.output
    assert "a-file' is not a directory" in one_message(result)


def test_an_output_dir_that_is_a_file_is_refused(tmp_path: Path, never_started: None) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = invoke(*SMALL, "--output-dir", str(blocker))
    assert result.exit_code == 2, result.output
    assert "exists and is not a directory" in one_message(result)


def test_save_requests_to_a_directory_is_refused(tmp_path: Path, never_started: None) -> None:
    result = invoke(*SMALL, "--save-requests", str(tmp_path), "--output-dir", str(tmp_path))
    assert result.exit_code == 2, result.output
    message = one_message(result)
    assert "request list file" in message and "' is a directory" in message


def test_an_output_file_name_taken_by_a_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "bench.json").mkdir()
    with pytest.raises(ValueError, match=r"bench\.json' is a directory"):
        check_output_dir(tmp_path, ["bench.json"])


def test_creatable_and_existing_outputs_pass(tmp_path: Path) -> None:
    check_output_dir(tmp_path / "new" / "deeper", ["bench.json"])
    check_output_dir(tmp_path, ["bench.json"])
    check_output_file(tmp_path / "new" / "requests.jsonl", "request list file")
    (tmp_path / "old.jsonl").write_text("")
    check_output_file(tmp_path / "old.jsonl", "request list file")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.jsonl"]  # checks create nothing


# ------------------------------------------------------------------ model and options
@pytest.mark.parametrize(
    ("options", "message"),
    [
        (("--num-blocks", "0"), "num_blocks"),  # refused, not the default pool
        (("--dtype", "int8"), "unknown dtype 'int8'"),
        (("--model", "MISSING"), "does not exist"),
    ],
)
def test_a_bad_model_or_engine_option_is_one_message_and_overwrites_nothing(
    tiny_model_dir: Path, tmp_path: Path, earlier_results: tuple[Path, Path],
    options: tuple[str, str], message: str,
) -> None:
    out, saved = earlier_results
    model = ("--model", str(tiny_model_dir))
    given = tuple(str(tmp_path / "nothing") if o == "MISSING" else o for o in options)
    result = invoke(
        *model, *given, *SMALL, "--output-dir", str(out), "--save-requests", str(saved),
    )
    assert result.exit_code == 2, result.output
    assert message in one_message(result)
    assert_untouched(out, saved)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--url", "http://127.0.0.1:9", "--timeout", "0"], "timeout must be a positive number"),
        (["--url", "http://127.0.0.1:9", "--timeout", "nan"], "timeout must be a positive number"),
        (["--url", "notaurl"], "bad URL 'notaurl'"),
        (["--url", "ftp://127.0.0.1:9"], "bad URL 'ftp://127.0.0.1:9'"),
    ],
)
def test_bad_url_options_are_refused_before_sending(
    args: list[str], message: str, tmp_path: Path
) -> None:
    result = invoke(*args, *SMALL, "--output-dir", str(tmp_path / "out"))
    assert result.exit_code == 2, result.output
    assert message in one_message(result)
    assert not (tmp_path / "out").exists()


def test_the_default_vocabulary_follows_a_small_model(tiny_model_dir: Path, tmp_path: Path) -> None:
    result = invoke(
        "--model", str(tiny_model_dir), "--dtype", "float32", "--cache", "on", *SMALL,
        "--output-dir", str(tmp_path),
    )
    assert result.exit_code == 0, result.output
    record = json.loads((tmp_path / "bench.json").read_text())
    assert record["vocab_size"] == TINY_VOCAB
    assert record["targets"][0]["completed"] == 2


def test_a_vocab_size_beyond_the_model_is_refused(
    tiny_model_dir: Path, tmp_path: Path, never_started: None
) -> None:
    result = invoke(
        "--model", str(tiny_model_dir), "--vocab-size", "32000", *SMALL,
        "--output-dir", str(tmp_path / "out"),
    )
    assert result.exit_code == 2, result.output
    assert f"({TINY_VOCAB} tokens)" in one_message(result)


# ------------------------------------------------------------------ loader crashes
@pytest.mark.parametrize("error", [KeyError("rope_theta"), AttributeError("x"),
                                   NotImplementedError("q4_x")])
def test_any_model_loading_error_is_one_message_with_its_type(
    error: Exception, tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken_loader(**kwargs) -> None:
        raise error

    monkeypatch.setattr("prefixcache.engine.async_llm.AsyncLLM", broken_loader)
    result = invoke(
        "--model", str(tiny_model_dir), *SMALL, "--output-dir", str(tmp_path / "out")
    )
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit)
    assert f"{type(error).__name__}: " in one_message(result)
    assert not (tmp_path / "out").exists()


def test_an_unreadable_model_config_is_one_message_with_its_type(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(folder: Path) -> None:
        raise KeyError("hidden_size")

    monkeypatch.setattr("prefixcache.engine.weights.read_hf_config", broken)
    result = invoke("--model", str(tiny_model_dir), *SMALL, "--output-dir", str(tmp_path))
    assert result.exit_code == 2, result.output
    assert "did not load: KeyError: 'hidden_size'" in one_message(result)
