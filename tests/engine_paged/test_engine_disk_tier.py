"""The disk KV tier: blocks written through survive a restart and answer bitwise as the
uncached engine does; torn, corrupt or foreign records are never served; salts stay apart."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from step_logits import record_step_logits

from prefixcache.engine.llm import LLM
from prefixcache.engine.sampling_params import SamplingParams

GREEDY = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
DOCS = [[(11 * i + 7 * k) % 290 + 3 for i in range(64)] for k in range(3)]
QUESTION = [7, 8, 9]


def engine(folder: Path, disk: Path | None, **kwargs) -> LLM:
    options = dict(dtype="float32", num_blocks=64, block_size=4, **kwargs)
    return LLM(str(folder), kv_disk_dir=disk, **options)


def answers(llm: LLM, salt: str | None = None) -> tuple[list[list[int]], list[torch.Tensor]]:
    logits = record_step_logits(llm)
    tokens = [llm.generate([doc + QUESTION], GREEDY, salt=salt)[0].token_ids for doc in DOCS]
    return tokens, logits


def records(disk: Path) -> list[Path]:
    return sorted(disk.rglob("*.kvb"))


def record_of(files: list[Path], tokens: list[int]) -> Path:
    """The record holding the block of these tokens."""
    for path in files:
        data = path.read_bytes()  # magic (6 bytes), header length (4), its xxh3 (8), header
        length = int.from_bytes(data[6:10], "little")
        if json.loads(data[18 : 18 + length])["tokens"] == tokens:
            return path
    raise AssertionError(f"no record of {tokens}")


def test_a_restart_serves_the_prefixes_from_disk_as_uncached(
    tiny_llama_dir: Path, tmp_path: Path
) -> None:
    disk = tmp_path / "kv"
    expected, expected_logits = answers(engine(tiny_llama_dir, None,
                                               enable_prefix_caching=False))  # fmt: skip
    first = engine(tiny_llama_dir, disk)
    answers(first)
    first.flush_tiers()
    written = first.stats()["disk_tier_records"]
    assert written >= 3 * 16 and len(records(disk)) == written
    del first
    again = engine(tiny_llama_dir, disk)  # a fresh process's view: the index from the files
    assert again.stats()["disk_tier_records"] == written
    got, got_logits = answers(again)
    assert got == expected
    assert all(torch.equal(a, b) for a, b in zip(got_logits, expected_logits, strict=True))
    stats = again.stats()
    assert stats["disk_tier_hit_tokens"] >= 3 * 64 - 4
    assert stats["disk_tier_dropped_records"] == 0
    again.cache.check_invariants()
    for path in records(disk):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_torn_and_corrupt_records_are_dropped_and_never_served(
    tiny_llama_dir: Path, tmp_path: Path
) -> None:
    disk = tmp_path / "kv"
    expected, _ = answers(engine(tiny_llama_dir, None, enable_prefix_caching=False))
    first = engine(tiny_llama_dir, disk)
    answers(first)
    first.flush_tiers()
    del first
    files = records(disk)
    truncated = record_of(files, DOCS[0][8:12])  # block 2 of the first document
    flipped = record_of(files, DOCS[1][4:8])  # block 1 of the second
    truncated.write_bytes(truncated.read_bytes()[:-100])  # torn at the end
    data = bytearray(flipped.read_bytes())
    data[len(data) // 2] ^= 0xFF  # a flipped byte in the payload
    flipped.write_bytes(bytes(data))
    (files[0].parent / ".tmp-interrupted").write_bytes(b"PCKV1\npartial")
    again = engine(tiny_llama_dir, disk)
    # the start reads headers: the torn record and the temporary file go at once
    assert again.stats()["disk_tier_dropped_records"] == 2 and not truncated.exists()
    got, _ = answers(again)
    assert got == expected
    # the payload's checksum catches the flipped byte when the record is read; the block is
    # computed again and written again, whole
    again.flush_tiers()
    assert again.stats()["disk_tier_dropped_records"] == 3
    assert flipped.read_bytes() != bytes(data)
    assert again.stats()["disk_tier_hit_tokens"] > 0  # the records before the bad ones


def test_a_record_corrupted_after_start_is_a_miss(tiny_llama_dir: Path, tmp_path: Path) -> None:
    disk = tmp_path / "kv"
    expected, _ = answers(engine(tiny_llama_dir, None, enable_prefix_caching=False))
    first = engine(tiny_llama_dir, disk)
    answers(first)
    first.flush_tiers()
    again = engine(tiny_llama_dir, disk)
    for path in records(disk):  # every record, after the index was read
        data = bytearray(path.read_bytes())
        data[-20] ^= 0x55
        path.write_bytes(bytes(data))
    got, _ = answers(again)
    assert got == expected
    stats = again.stats()
    assert stats["disk_tier_hit_tokens"] == 0 and stats["disk_tier_dropped_records"] >= 3


def test_another_block_size_or_dtype_never_reads_the_files(
    tiny_llama_dir: Path, tmp_path: Path
) -> None:
    disk = tmp_path / "kv"
    first = engine(tiny_llama_dir, disk)
    answers(first)
    first.flush_tiers()
    other_block = LLM(str(tiny_llama_dir), kv_disk_dir=disk, dtype="float32", num_blocks=32,
                      block_size=8)  # fmt: skip
    other_dtype = LLM(str(tiny_llama_dir), kv_disk_dir=disk, dtype="bfloat16", num_blocks=64,
                      block_size=4)  # fmt: skip
    for llm in (other_block, other_dtype):
        assert llm.stats()["disk_tier_records"] == 0
        answers(llm)
        assert llm.stats()["disk_tier_hit_tokens"] == 0
    assert len([p for p in disk.iterdir() if p.is_dir()]) >= 2


def test_the_disk_keeps_salts_apart_after_a_restart(tiny_llama_dir: Path, tmp_path: Path) -> None:
    disk = tmp_path / "kv"
    first = engine(tiny_llama_dir, disk)
    answers(first, salt="tenant-a")
    first.flush_tiers()
    again = engine(tiny_llama_dir, disk)
    answers(again, salt="tenant-b")
    assert again.stats()["disk_tier_hit_tokens"] == 0
    answers(again, salt="tenant-a")
    assert again.stats()["disk_tier_hit_tokens"] > 0


def test_bad_disk_settings_are_refused_up_front(tiny_llama_dir: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(ValueError, match="not writable"):
        engine(tiny_llama_dir, blocker / "kv")
    with pytest.raises(ValueError, match="kv_disk_size needs kv_disk_dir"):
        engine(tiny_llama_dir, None, kv_disk_size="1GiB")
    with pytest.raises(ValueError, match="kv_disk_size"):
        engine(tiny_llama_dir, tmp_path / "kv", kv_disk_size="huge")
    assert os.path.isdir(tmp_path) and not (tmp_path / "kv").exists()


def test_clearing_the_disk_tier_deletes_its_records(tiny_llama_dir: Path, tmp_path: Path) -> None:
    disk = tmp_path / "kv"
    llm = engine(tiny_llama_dir, disk)
    answers(llm)
    assert llm.clear_disk_tier() > 0
    assert not records(disk) and llm.stats()["disk_tier_records"] == 0
    assert engine(tiny_llama_dir, disk).stats()["disk_tier_records"] == 0


def test_a_process_that_exits_with_writes_queued_writes_them(
    tiny_llama_dir: Path, tmp_path: Path
) -> None:
    """No flush before exit: the queued blocks are still written, and the exit is clean (a
    writer thread inside a torch call at the interpreter's teardown aborted the process)."""
    disk = tmp_path / "kv"
    script = (
        "import sys\n"
        "from prefixcache.engine.llm import LLM\n"
        "from prefixcache.engine.sampling_params import SamplingParams\n"
        f"llm = LLM({str(tiny_llama_dir)!r}, dtype='float32', num_blocks=256, block_size=4,\n"
        f"          kv_disk_dir={str(disk)!r})\n"
        f"for doc in {DOCS!r}:\n"
        "    llm.generate([doc * 4], SamplingParams(max_tokens=1, temperature=0.0))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert len(records(disk)) == 3 * (4 * 64 // 4)
