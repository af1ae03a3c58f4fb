"""``tl.nn.Tokenizer`` against what ``transformers``' ``AutoTokenizer`` does with the same files
(``tests/fixtures/tokenizer``, made by ``tests/fixtures/make_tokenizer.py``), and Hub ids
resolved through a Hugging Face cache laid out by the test."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import tempo_lab as tl

FIXTURE = Path(__file__).parents[1] / "fixtures" / "tokenizer"
EXPECTED = json.loads((FIXTURE / "expected.json").read_text())


@pytest.fixture(scope="module")
def tok():
    return tl.nn.Tokenizer.from_pretrained(FIXTURE)


def test_ids_and_texts_are_transformers(tok):
    assert tok.vocab_size == EXPECTED["vocab_size"]
    assert [tok.encode(s) for s in EXPECTED["texts"]] == EXPECTED["ids"]
    assert tok.encode_batch(EXPECTED["texts"], add_special_tokens=False) == EXPECTED["ids_plain"]
    assert [tok.decode(i) for i in EXPECTED["ids"]] == EXPECTED["decoded"]
    assert [tok.decode(np.array(i, dtype=np.int32), skip_special_tokens=True)
            for i in EXPECTED["ids"]] == EXPECTED["decoded_skip"]
    assert (tok.bos_token_id, tok.eos_token_id) == (EXPECTED["bos_token_id"],
                                                    EXPECTED["eos_token_id"])
    assert tok.pad_token_id is None
    assert repr(tok) == "Tokenizer(vocab=96, bos='<s>', eos='</s>', unk='<unk>', chat_template=yes)"


def test_chat_template_is_rendered_as_transformers_renders_it(tok):
    msgs = EXPECTED["messages"]
    assert tok.apply_chat_template(msgs, tokenize=False) == EXPECTED["chat_text"]
    assert tok.apply_chat_template(msgs) == EXPECTED["chat_ids"]
    with pytest.raises(tl.ArgumentError, match="refused the messages: unknown role robot"):
        tok.apply_chat_template([{"role": "robot", "content": "hi"}])
    with pytest.raises(tl.ArgumentError, match="list of messages"):
        tok.apply_chat_template("hello")


def test_the_chat_template_file_wins_and_a_tokenizer_without_one_says_so(tmp_path):
    shutil.copy(FIXTURE / "tokenizer.json", tmp_path)
    plain = tl.nn.Tokenizer.from_pretrained(tmp_path / "tokenizer.json")
    assert plain.specials == {} and plain.bos_token_id is None
    with pytest.raises(tl.ArgumentError, match="has no chat template"):
        plain.apply_chat_template([{"role": "user", "content": "x"}])
    (tmp_path / "chat_template.jinja").write_text("{{ messages[0]['content'] }}!")
    assert tl.nn.Tokenizer.from_pretrained(tmp_path).apply_chat_template(
        [{"role": "user", "content": "cat"}], tokenize=False) == "cat!"


def test_clean_up_tokenization_spaces_follows_the_config(tmp_path):
    shutil.copy(FIXTURE / "tokenizer.json", tmp_path)
    cfg = json.loads((FIXTURE / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        dict(cfg, clean_up_tokenization_spaces=True)))
    tok = tl.nn.Tokenizer.from_pretrained(tmp_path)
    ids = tok.encode("the cat sat .", add_special_tokens=False)
    assert tok.decode(ids) == "the cat sat."


@pytest.mark.parametrize("damage, match", [
    ("missing", "no tokenizer.json"),
    ("garbage", "not a tokenizer the tokenizers package can read"),
    ("config_list", "where a JSON object is needed"),
    ("bad_special", "bos_token is 5"),
    ("unknown_special", "eos_token '<eos>' is not a token"),
    ("bad_template", "not valid jinja2"),
    ("bad_clean", "clean_up_tokenization_spaces is 'yes'"),
])
def test_damaged_tokenizers_are_located_errors(tmp_path, damage, match):
    shutil.copy(FIXTURE / "tokenizer.json", tmp_path)
    cfg = json.loads((FIXTURE / "tokenizer_config.json").read_text())
    if damage == "missing":
        (tmp_path / "tokenizer.json").unlink()
    elif damage == "garbage":
        (tmp_path / "tokenizer.json").write_text('{"model": 3}')
    elif damage == "config_list":
        cfg = [cfg]
    elif damage == "bad_special":
        cfg["bos_token"] = 5
    elif damage == "unknown_special":
        cfg["eos_token"] = "<eos>"
    elif damage == "bad_template":
        cfg["chat_template"] = "{% for %}"
    elif damage == "bad_clean":
        cfg["clean_up_tokenization_spaces"] = "yes"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    with pytest.raises(tl.TempoLabError, match=match) as err:
        tok = tl.nn.Tokenizer.from_pretrained(tmp_path)
        tok.apply_chat_template([{"role": "user", "content": "x"}])
    assert str(err.value).startswith(f"{__file__}:")


def test_bad_arguments_are_located(tok):
    for call, match in ((lambda: tok.decode([1, 200]), r"id 200 is outside the vocabulary \[0, 96\)"),
                        (lambda: tok.decode("abc"), "sequence of int ids"),
                        (lambda: tok.encode_batch("abc"), "list of strings"),
                        (lambda: tl.nn.Tokenizer.from_pretrained(None), "got NoneType"),
                        (lambda: tl.nn.Tokenizer.from_pretrained(3), "got int 3"),
                        (lambda: tl.nn.Tokenizer.from_pretrained("a\x00b"), "NUL byte")):
        with pytest.raises(tl.ArgumentError, match=match) as err:
            call()
        assert str(err.value).startswith(f"{__file__}:")


def _lay_out_cache(root: Path, repo: str, files: Path) -> Path:
    """A Hugging Face cache holding ``repo``'s main revision as ``huggingface_hub`` lays it out:
    blobs by hash, a snapshot folder of links to them, ``refs/main`` naming the snapshot."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    base = root / f"models--{repo.replace('/', '--')}"
    snap = base / "snapshots" / commit
    (base / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    (base / "refs").mkdir()
    (base / "refs" / "main").write_text(commit)
    for k, f in enumerate(sorted(files.iterdir())):
        blob = base / "blobs" / f"{k:040x}"
        shutil.copy(f, blob)
        (snap / f.name).symlink_to(Path("..") / ".." / "blobs" / blob.name)
    return snap


def test_a_hub_id_resolves_through_the_local_cache_offline(tmp_path, monkeypatch):
    pytest.importorskip("huggingface_hub")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _lay_out_cache(tmp_path, "tiny-org/tiny-tok", FIXTURE)
    tok = tl.nn.Tokenizer.from_pretrained("tiny-org/tiny-tok")
    assert tok.encode(EXPECTED["texts"][0]) == EXPECTED["ids"][0]
    with pytest.raises(tl.CheckpointError, match="hf download tiny-org/absent") as err:
        tl.nn.Tokenizer.from_pretrained("tiny-org/absent")
    assert str(err.value).startswith(f"{__file__}:")
    with pytest.raises(tl.CheckpointError, match="no such checkpoint directory"):
        tl.nn.Tokenizer.from_pretrained(tmp_path / "not" / "here")


def test_a_tokenizer_nested_past_the_readers_limit_is_named(tmp_path):
    (tmp_path / "tokenizer.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(tl.CheckpointError, match="nested deeper than 100 levels"):
        tl.nn.Tokenizer.from_pretrained(tmp_path)
    (tmp_path / "tokenizer.json").unlink()
    shutil.copy(FIXTURE / "tokenizer.json", tmp_path)
    (tmp_path / "tokenizer_config.json").write_text('{"bos_token": ' + "1" * 5000 + "}")
    with pytest.raises(tl.CheckpointError, match="digits"):
        tl.nn.Tokenizer.from_pretrained(tmp_path)


def test_generation_config_adds_the_ids_that_end_a_generation(tmp_path):
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(FIXTURE / f, tmp_path)
    assert tl.nn.Tokenizer.from_pretrained(tmp_path).eos_token_ids == (1,)
    (tmp_path / "generation_config.json").write_text('{"eos_token_id": [1, 7, 9]}')
    assert tl.nn.Tokenizer.from_pretrained(tmp_path).eos_token_ids == (1, 7, 9)
    (tmp_path / "generation_config.json").write_text('{"eos_token_id": 500}')
    with pytest.raises(tl.CheckpointError, match="eos_token_id is 500"):
        tl.nn.Tokenizer.from_pretrained(tmp_path)


def test_the_generation_config_of_a_hub_id_in_the_cache(tmp_path, monkeypatch):
    """``generation_config.json`` beside the tokenizer, read by ``from_pretrained`` and by
    ``tl.nn.generate(..., generation_config=hub_id)``, from a cache laid out by the test."""
    from tempo_lab.nn.generate import _generation_config

    pytest.importorskip("huggingface_hub")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    files = tmp_path / "files"
    files.mkdir()
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(FIXTURE / f, files)
    gen = FIXTURE.parent / "generation" / "greedy_penalised" / "generation_config.json"
    shutil.copy(gen, files)
    _lay_out_cache(tmp_path / "cache", "tiny-org/tiny-gen", files)
    want = json.loads(gen.read_text())
    tok = tl.nn.Tokenizer.from_pretrained("tiny-org/tiny-gen")
    assert tok.generation_config == want and tok.eos_token_ids == (1, 25)
    got, where = _generation_config("tiny-org/tiny-gen", None, 96)
    assert got == want and where.endswith("generation_config.json")
    assert tl.nn.Tokenizer.from_pretrained(FIXTURE).generation_config == {}
