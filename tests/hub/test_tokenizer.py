"""The model's own tokenizer.json from a loopback fake Hub counts a data set's tokens (no download)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from services.cli.main import main
from services.datacheck import check_dataset
from services.datacheck.formats import detect_format, format_votes, row_text
from services.hub.tokenizer import TokenizerCache, model_counter
from tests.hub.conftest import QWEN_1_8B
from tests.hub.fake_hub import FakeHub

TURKISH = [
    "Kişisel verilerin korunması kanunu kapsamında başvurunuz değerlendirilmiştir.",
    "Müşteri hizmetlerimize ulaşmak için lütfen hafta içi saat dokuzdan sonra arayınız.",
    "Çekoslovakyalılaştıramadıklarımızdan mısınız diye sordular.",
    "Faturanızın son ödeme tarihi yarın; gecikme durumunda ek ücret uygulanabilir.",
]
ENGLISH = [
    "Your application has been reviewed under the personal data protection law.",
    "Please call our customer service on weekdays after nine in the morning.",
    "The invoice is due tomorrow; a late fee may apply after that date.",
    "Fine-tuning a model on a small data set still needs a validation split.",
]


def small_bpe() -> Tokenizer:
    """A byte-level BPE trained here on a few English lines only, so Turkish splits into more pieces."""
    tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["[UNK]"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(ENGLISH * 20, trainer=trainer)
    return tokenizer


def write_jsonl(path: Path, texts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in texts), encoding="utf-8")
    return path


def expected_lengths(path: Path, tokenizer: Tokenizer) -> list[int]:
    """What tokenizers itself counts for each (plain text) row as the exported train.py encodes it: the text with the
    tokenizer's special tokens, and one EOS appended."""
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    fmt = detect_format(format_votes(rows))
    assert fmt == "text"
    texts = [row_text(r, fmt).text for r in rows]
    return [len(e.ids) + 1 for e in tokenizer.encode_batch(texts, add_special_tokens=True)]


@pytest.fixture
def tokenizer_hub(hub: FakeHub) -> tuple[FakeHub, Tokenizer]:
    tokenizer = small_bpe()
    repo = hub.add_model("acme/tiny-bpe", QWEN_1_8B)
    repo.files["tokenizer.json"] = tokenizer.to_str().encode()
    return hub, tokenizer


@pytest.mark.parametrize("texts", [TURKISH, ENGLISH], ids=["turkish", "english"])
def test_the_models_tokenizer_counts_exactly(
    tokenizer_hub: tuple[FakeHub, Tokenizer], tmp_path: Path, texts: list[str]
) -> None:
    hub, tokenizer = tokenizer_hub
    data = write_jsonl(tmp_path / "data.jsonl", texts)
    counter, source = model_counter("acme/tiny-bpe", TokenizerCache(tmp_path / "cache"))
    report = check_dataset(data, counter=counter, tokenizer=source)
    lengths = expected_lengths(data, tokenizer)
    assert report.tokenizer["source"] == "hub:acme/tiny-bpe"
    assert report.tokenizer["revision"] == hub.repos["acme/tiny-bpe"].commit
    assert report.tokens.method == "tokenizer_json"
    assert report.tokens.max_tokens == max(lengths)
    assert report.tokens.tokens_per_epoch_packed == sum(lengths)
    assert report.tokens.rows_counted == len(texts)


def test_turkish_is_counted_above_the_estimate(tokenizer_hub: tuple[FakeHub, Tokenizer], tmp_path: Path) -> None:
    _, tokenizer = tokenizer_hub
    data = write_jsonl(tmp_path / "tr.jsonl", TURKISH)
    counter, source = model_counter("acme/tiny-bpe", TokenizerCache(tmp_path / "cache"))
    exact = check_dataset(data, counter=counter, tokenizer=source).tokens.tokens_per_epoch_packed
    estimate = check_dataset(data)
    assert estimate.tokenizer == {"source": "estimate: characters/4"}
    assert exact == sum(expected_lengths(data, tokenizer)) > estimate.tokens.tokens_per_epoch_packed


def test_cached_per_model_after_the_first_fetch(tokenizer_hub: tuple[FakeHub, Tokenizer], tmp_path: Path) -> None:
    hub, _ = tokenizer_hub
    cache = TokenizerCache(tmp_path / "cache")
    model_counter("acme/tiny-bpe", cache)
    fetched = len(hub.requests)
    assert fetched > 0
    hub.close()  # the Hub is gone; the cache answers
    _, source = model_counter("ACME/tiny-bpe", cache)
    assert source["source"] == "hub:acme/tiny-bpe"
    assert (tmp_path / "cache" / "tokenizers" / "acme--tiny-bpe.json").is_file()


def test_without_a_tokenizer_the_report_says_it_estimated(hub: FakeHub, tmp_path: Path) -> None:
    hub.add_model("acme/no-tokenizer", QWEN_1_8B)
    data = write_jsonl(tmp_path / "en.jsonl", ENGLISH)
    for name, why in (("acme/no-tokenizer", "no tokenizer.json"), ("acme/missing", "not found")):
        counter, source = model_counter(name, TokenizerCache(tmp_path / "cache"))
        report = check_dataset(data, counter=counter, tokenizer=source)
        assert report.tokenizer["source"] == "estimate: characters/4" and why in report.tokenizer["reason"]
        assert report.tokens.method == "approx_4_chars_per_token"
        assert why in report.tokens.notes[0]


def test_cli_check_with_model(
    tokenizer_hub: tuple[FakeHub, Tokenizer],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    hub, tokenizer = tokenizer_hub
    monkeypatch.setenv("GPUPLAN_HUB_CACHE_DIR", str(tmp_path / "cache"))
    data = write_jsonl(tmp_path / "tr.jsonl", TURKISH)
    assert main(["data", "check", str(data), "--model", "acme/tiny-bpe", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tokenizer"]["source"] == "hub:acme/tiny-bpe"
    assert out["tokens"]["tokens_per_epoch_packed"] == sum(expected_lengths(data, tokenizer))
    assert main(["data", "check", str(data), "--model", "acme/tiny-bpe"]) == 0
    assert (
        f"tokenizer: hub:acme/tiny-bpe (revision {hub.repos['acme/tiny-bpe'].commit[:12]})" in capsys.readouterr().out
    )
    assert main(["data", "check", str(data), "--model", "acme/tiny-bpe", "--tokenizer", "x.json"]) == 2
    assert "--model and --tokenizer" in capsys.readouterr().err
