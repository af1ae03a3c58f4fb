"""``tl.nn.generate``: prompts of any lengths in, each row's new tokens (or text) out, equal to
what ``transformers`` generates (the fixtures' greedy tokens) and to each row decoded alone."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tempo_lab as tl

FIXTURES = Path(__file__).parent / "fixtures"
CKPT = FIXTURES / "hf" / "llama3_tied"          # vocab 96, as the tokenizer fixture's


@pytest.fixture(scope="module")
def llama():
    model, params = tl.nn.Llama.from_pretrained(CKPT)
    return model, params, np.load(CKPT / "expected.npz")


def test_greedy_tokens_are_transformers(llama):
    model, params, expected = llama
    got = tl.nn.generate(model, params, expected["prompt"].tolist(), max_new_tokens=20)
    assert got == expected["greedy"].tolist()


def test_prompts_as_an_array(llama):
    model, params, expected = llama
    assert tl.nn.generate(model, params, expected["prompt"], max_new_tokens=4) == \
        expected["greedy"][:, :4].tolist()


def test_prompts_of_different_lengths_decode_as_each_alone(llama):
    model, params, expected = llama
    long, short = expected["prompt"][0].tolist(), expected["prompt"][1, :3].tolist()
    both = tl.nn.generate(model, params, [short, long, short[:1]], max_new_tokens=6)
    alone = [tl.nn.generate(model, params, [p], max_new_tokens=6)[0]
             for p in (short, long, short[:1])]
    assert both == alone
    assert both[1] == expected["greedy"][0, :6].tolist()


def test_a_row_ends_at_its_end_of_sequence_token(llama):
    model, params, expected = llama
    greedy = expected["greedy"][0].tolist()
    stop = greedy[3]
    first = greedy.index(stop)
    got = tl.nn.generate(model, params, [expected["prompt"][0].tolist()], max_new_tokens=20,
                         eos=stop)
    assert got == [greedy[:first + 1]]
    assert tl.nn.generate(model, params, [expected["prompt"][0].tolist()], max_new_tokens=20,
                          eos=[95, stop]) == got


def test_text_in_text_out(llama):
    model, params, _ = llama
    tok = tl.nn.Tokenizer.from_pretrained(FIXTURES / "tokenizer")
    prompts = ["the cat sat", "a dog ran in the park,"]
    texts = tl.nn.generate(model, params, prompts, tokenizer=tok, max_new_tokens=8, eos=[])
    ids = tl.nn.generate(model, params, [tok.encode(p) for p in prompts], max_new_tokens=8)
    assert texts == [tok.decode(i, skip_special_tokens=True) for i in ids]
    assert all(isinstance(s, str) and s for s in texts)
    one = tl.nn.generate(model, params, prompts[0], tokenizer=tok, max_new_tokens=8, eos=[])
    assert one == texts[0]


@pytest.mark.parametrize("call, match", [
    (lambda m, p: tl.nn.generate(m, p, ["the cat"]), "text prompts need tokenizer"),
    (lambda m, p: tl.nn.generate(m, p, [[1, 2]], max_new_tokens=0), "max_new_tokens must be"),
    (lambda m, p: tl.nn.generate(m, p, [[1, 200]]), r"id 200, outside .* \[0, 96\)"),
    (lambda m, p: tl.nn.generate(m, p, [[1, 2], []]), "prompt 1 must be a non-empty list"),
    (lambda m, p: tl.nn.generate(m, p, 7), "prompts must be a string"),
    (lambda m, p: tl.nn.generate(m, p, [1, 2]), r"one list of ids; .* \[\[1, 2\]\]"),
    (lambda m, p: tl.nn.generate(m, p, [[1]], eos="x"), "eos must be a token id"),
    (lambda m, p: tl.nn.generate(m, p, [[1]], tokenizer="tok"), "must be a tl.nn.Tokenizer"),
    (lambda m, p: tl.nn.generate("llama", p, [[1]]), "model must be a tl.nn decoder"),
])
def test_bad_arguments_are_located(llama, call, match):
    model, params, _ = llama
    with pytest.raises(tl.ArgumentError, match=match) as err:
        call(model, params)
    assert str(err.value).startswith(f"{__file__}:")


def test_streaming_gives_each_rows_tokens_as_they_come_on_xla(llama, capsys):
    model, params, expected = llama
    prompts = [expected["prompt"][0].tolist(), expected["prompt"][1, :2].tolist()]
    seen = []
    got = tl.nn.generate(model, params, prompts, max_new_tokens=5,
                         stream=lambda row, token: seen.append((row, token)))
    assert [[tok for r, tok in seen if r == row] for row in (0, 1)] == got
    tok = tl.nn.Tokenizer.from_pretrained(FIXTURES / "tokenizer")
    shown = tl.nn.TextStream()
    texts = tl.nn.generate(model, params, ["the cat sat", "a dog"], tokenizer=tok,
                           max_new_tokens=6, eos=[], stream=shown)
    assert [shown.text[0], shown.text[1]] == texts
    printed = capsys.readouterr().out
    assert texts[0] in printed and f"[1] {texts[1]}" in printed
    with pytest.raises(tl.ArgumentError, match="stream must be a function"):
        tl.nn.generate(model, params, prompts, stream="print")

    def on_token(row, token):
        raise RuntimeError("boom")

    with pytest.raises(tl.CallbackError, match=r"on_token \(tl.nn.generate's stream\) .*boom"):
        tl.nn.generate(model, params, prompts, max_new_tokens=2, stream=on_token)


def test_sampling_controls(llama):
    model, params, expected = llama
    prompts = expected["prompt"].tolist()
    greedy = expected["greedy"][:, :8].tolist()
    # one candidate left: sampling at any temperature is greedy
    assert tl.nn.generate(model, params, prompts, max_new_tokens=8, temperature=5.0,
                          top_k=1, seed=3) == greedy
    assert tl.nn.generate(model, params, prompts, max_new_tokens=8, temperature=5.0,
                          top_p=1e-6, seed=3) == greedy
    hot = tl.nn.generate(model, params, prompts, max_new_tokens=8, temperature=5.0, seed=3)
    assert hot != greedy and hot == tl.nn.generate(model, params, prompts, max_new_tokens=8,
                                                   temperature=5.0, seed=3)
    wide = tl.nn.generate(model, params, prompts, max_new_tokens=8, temperature=5.0, seed=3,
                          top_k=96, top_p=1.0)
    assert wide == hot
    for bad, match in ((dict(top_k=0), "top_k must be"), (dict(top_p=1.5), "top_p must be"),
                       (dict(repetition_penalty=0), "repetition_penalty must be"),
                       (dict(temperature=float("nan")), "temperature must be")):
        with pytest.raises(tl.ArgumentError, match=match):
            tl.nn.generate(model, params, prompts, max_new_tokens=2, **bad)


def test_the_same_program_from_another_line_compiles_once(llama, monkeypatch):
    """A kernel's key held its ops' source lines (the repr of a fused body), so the same
    decode called from another line compiled its XLA program again."""
    from tempo_lab.runtime import xla

    model, params, expected = llama
    made = []
    get = xla._PROGRAMS.get
    monkeypatch.setattr(xla._PROGRAMS, "get", lambda key, make: get(
        key, lambda: made.append(1) or make()))
    a = tl.nn.generate(model, params, [[5, 6, 7]], max_new_tokens=3)
    b = tl.nn.generate(model, params, [[5, 6, 7]], max_new_tokens=3)
    assert a == b and len(made) <= 1
