"""A GPT trained end to end in one process on ``prepare-text``'s token shards, as a user runs
it: ``dt-data prepare-text`` then ``python -m trainer --data tokens``."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.launchers import REPO
from trainer.data import DataError
from trainer.data.text_prepare import BYTE_VOCAB
from trainer.engines.local import LocalDist
from trainer.settings.flags import parse
from trainer.training.run import train

TEXT = "The quick brown fox jumps over the lazy dog. " * 40


def run(*args: str, cwd=REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=cwd)


def test_prepared_text_trains_a_gpt_that_learns_it_and_reports_tokens_and_flops(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(4):
        (corpus / f"doc{i}.txt").write_text(TEXT, encoding="utf-8")
    prepared = run(
        "-m",
        "trainer.data",
        "prepare-text",
        str(corpus),
        str(tmp_path / "tok"),
        "--val-fraction",
        "0.1",
        cwd=REPO,
    )
    assert prepared.returncode == 0, prepared.stderr
    out = tmp_path / "run"
    flags = [
        "--model",
        "gpt-tiny",
        "--backend",
        "local",
        "--data",
        "tokens",
        "--data-dir",
        str(tmp_path / "tok"),
        "--context",
        "32",
        "--batch-size",
        "8",
        "--epochs",
        "3",
        "--optimizer",
        "adamw",
        "--lr",
        "0.003",
        "--warmup-epochs",
        "0",
        "--log-every",
        "5",
        "--loader-workers",
        "0",
        "--output-dir",
        str(out),
    ]
    trained = run("-m", "trainer", *flags, cwd=REPO)
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert "tokens/sec per worker" in trained.stdout
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train_records = [r for r in records if r["kind"] == "train"]
    assert {"tokens_per_sec", "tokens_per_sec_total", "model_tflops"} <= set(train_records[-1])
    assert "mfu" not in train_records[-1]  # no known peak on a CPU
    evals = [r for r in records if r["kind"] == "eval"]
    # A repeated sentence is easy: far below the ln(257) = 5.55 of guessing bytes.
    assert len(evals) == 3 and evals[-1]["val_loss"] < 0.5 * evals[0]["val_loss"] < 5.55

    # Another vocabulary than the shards': one line, exit 2 (the command's code for a
    # DataError, which tests/trainer/data/test_bad_data.py sees a process exit with), nothing
    # trained. Decided in process: the same command line, trained until the data is refused.
    wrong = parse(
        [*flags, "--vocab-size", str(BYTE_VOCAB + 1), "--output-dir", str(tmp_path / "wrong")]
    )
    with pytest.raises(DataError) as refused:
        train(wrong.config, LocalDist())
    assert "\n" not in str(refused.value) and "vocab_size=258" in str(refused.value)
    assert not (tmp_path / "wrong").exists()
