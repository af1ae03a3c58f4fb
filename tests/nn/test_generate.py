"""``tl.nn.generate``: prompts of any lengths in, each row's new tokens (or text) out, equal to
what ``transformers`` generates (the fixtures' greedy tokens) and to each row decoded alone."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import tempo_lab as tl

FIXTURES = Path(__file__).parents[1] / "fixtures"
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


@pytest.mark.parametrize("name", ["gpt2_tiny", "mistral_window", "qwen2_bias"])
def test_every_architecture_decodes_a_padded_batch_as_each_alone(name):
    """Prompts aligned at their ends (padded at the start): learned positions (GPT-2), a
    sliding window shorter than the longest prompt (Mistral) and q/k/v biases (Qwen2) count
    from each row's first token, and the padding gets no attention; with a repetition penalty,
    the padding's ids are not held."""
    model, params = tl.nn.AutoModel.from_pretrained(FIXTURES / "hf" / name)
    rng = np.random.default_rng(1)
    rows = [rng.integers(1, min(model.vocab, 90), size=k).tolist() for k in (2, 11, 5)]
    for kw in ({}, {"repetition_penalty": 1.5}):
        both = tl.nn.generate(model, params, rows, max_new_tokens=5, **kw)
        alone = [tl.nn.generate(model, params, [r], max_new_tokens=5, **kw)[0] for r in rows]
        assert both == alone, (kw, both, alone)


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
    for bad, match in ((dict(top_k=-1), "top_k must be"), (dict(top_p=1.5), "top_p must be"),
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


GENERATION = FIXTURES / "generation"   # made by fixtures/make_generation_configs.py


@pytest.mark.parametrize("case", sorted(p.name for p in GENERATION.iterdir() if p.is_dir()))
def test_generation_config_defaults_are_transformers(llama, case):
    """Each prompt's tokens and settings as transformers' generate gives them with the
    checkpoint's generation_config.json: the call's arguments win, then the file's fields,
    then transformers' defaults; greedy when do_sample is false, max_length per prompt."""
    from tempo_lab.nn.generate import _generation_config, _settings

    model, params, _ = llama
    expected = json.loads((GENERATION / case / "expected.json").read_text())
    prompts = expected["prompts"]
    for call in expected["calls"]:
        kwargs = call["kwargs"]
        gen, where = _generation_config(GENERATION / case, None, model.vocab)
        args = dict(do_sample=None, temperature=None, top_k=None, top_p=None,
                    repetition_penalty=None, max_new_tokens=None)
        sample, limits = _settings({**args, **kwargs}, gen, where, list(map(len, prompts)), 96)
        for want, n in zip(call["resolved"], limits):
            assert n == want["new_tokens"]
            assert sample["repetition_penalty"] == want["repetition_penalty"]
            if want["do_sample"]:
                assert (sample["temperature"], sample["top_k"], sample["top_p"] or 1.0) == \
                    (want["temperature"], want["top_k"], want["top_p"])
            else:
                assert sample["temperature"] == 0
        if "tokens" in call:
            got = tl.nn.generate(model, params, prompts, generation_config=GENERATION / case,
                                 **kwargs)
            assert got == call["tokens"], kwargs


def test_the_tokenizers_generation_config_is_applied(llama, tmp_path):
    model, params, _ = llama
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(FIXTURES / "tokenizer" / f, tmp_path)
    shutil.copy(GENERATION / "greedy_penalised" / "generation_config.json", tmp_path)
    expected = json.loads((GENERATION / "greedy_penalised" / "expected.json").read_text())
    tok = tl.nn.Tokenizer.from_pretrained(tmp_path)
    assert tok.generation_config["repetition_penalty"] == 3.0
    assert set(tok.eos_token_ids) == {1, 25}
    prompts, want = expected["prompts"], expected["calls"][0]["tokens"]
    assert tl.nn.generate(model, params, prompts, tokenizer=tok) == want
    # the call wins; {} sets no field (transformers' defaults: 20 greedy tokens)
    assert tl.nn.generate(model, params, prompts, tokenizer=tok, max_new_tokens=4,
                          repetition_penalty=1.0) == expected["calls"][1]["tokens"]
    plain = tl.nn.generate(model, params, prompts, tokenizer=tok, generation_config={})
    assert [len(r) for r in plain] == [20, 20, 20]
    assert tl.nn.generate(model, params, prompts, generation_config={
        "repetition_penalty": 3.0, "max_new_tokens": 9, "eos_token_id": 25}) == want


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(generation_config={"num_beams": 4}), tl.CheckpointError,
     "generation_config: num_beams is 4, which asks for beam search; .* cannot honour"),
    (dict(generation_config={"do_sample": True, "min_p": 0.1}), tl.CheckpointError,
     "min_p is 0.1"),
    (dict(generation_config={"top_k": -1}), tl.ArgumentError,
     r"generation_config: top_k is -1; give an int >= 0"),
    (dict(generation_config={"eos_token_id": [3, 500]}), tl.ArgumentError,
     r"eos_token_id is \[3, 500\]; give an id or a list of ids in \[0, 96\)"),
    (dict(generation_config=5), tl.ArgumentError, "generation_config must be a checkpoint"),
    (dict(generation_config=FIXTURES / "tokenizer"), tl.CheckpointError,
     "no generation_config.json"),
    (dict(generation_config={"max_length": 3}), tl.ArgumentError,
     "prompt 0 has 5 tokens, not fewer than max_length 3"),
    (dict(do_sample=True, temperature=0), tl.ArgumentError, "at temperature 0"),
    (dict(do_sample="yes"), tl.ArgumentError, "do_sample must be True, False or None"),
])
def test_bad_generation_configs_are_located(llama, kwargs, error, match):
    model, params, expected = llama
    with pytest.raises(error, match=match) as err:
        tl.nn.generate(model, params, expected["prompt"].tolist(), **kwargs)
    assert str(err.value).startswith(f"{__file__}:")


def test_chat_messages_are_rendered_by_the_chat_template(llama):
    model, params, _ = llama
    tok = tl.nn.Tokenizer.from_pretrained(FIXTURES / "tokenizer")
    talk = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "the cat?"}]
    other = [{"role": "user", "content": "a dog ran"}]
    by_hand = tl.nn.generate(model, params, [tok.apply_chat_template(m) for m in (talk, other)],
                             max_new_tokens=6, eos=[])
    want = [tok.decode(r, skip_special_tokens=True) for r in by_hand]
    assert tl.nn.generate(model, params, [talk, other], tokenizer=tok, max_new_tokens=6,
                          eos=[]) == want
    assert tl.nn.generate(model, params, talk, tokenizer=tok, max_new_tokens=6, eos=[]) == want[0]
    assert tl.nn.generate(model, params, ["a dog ran"], tokenizer=tok, chat=True,
                          max_new_tokens=6, eos=[]) == want[1:]
    assert tl.nn.generate(model, params, "a dog ran", tokenizer=tok, chat=True,
                          max_new_tokens=6, eos=[]) == want[1]
    for kwargs, error, match in (
            (dict(prompts=[talk]), tl.ArgumentError, "a chat needs tokenizer"),
            (dict(prompts=[talk], tokenizer=tok, chat=False), tl.ArgumentError,
             "chat messages but chat=False"),
            (dict(prompts=[[1, 2]], tokenizer=tok, chat=True), tl.ArgumentError,
             "chat=True takes a string"),
            (dict(prompts=[[{"role": "robot", "content": "hi"}]], tokenizer=tok),
             tl.ArgumentError, "refused the messages: unknown role robot"),
            (dict(prompts="hi", tokenizer=tok, chat="yes"), tl.ArgumentError,
             "chat must be True, False or None")):
        with pytest.raises(error, match=match) as err:
            tl.nn.generate(model, params, **kwargs)
        assert str(err.value).startswith(f"{__file__}:")


def test_the_batch_stops_when_every_row_has_ended(llama, monkeypatch):
    """With ids that end a row, the program's steps end where the last row has ended (a
    tl.until over the steps), not at the longest row's limit; the tokens are those of the
    full run cut at each row's EOS, streamed or not."""
    from tempo_lab.program import Program

    model, params, expected = llama
    prompts = [expected["prompt"][0].tolist(), expected["prompt"][1, :3].tolist()]
    full = tl.nn.generate(model, params, prompts, max_new_tokens=12)
    stops = sorted({full[0][2], full[1][4]})
    want = [r[:next(k for k, i in enumerate(r) if i in stops) + 1] for r in full]
    steps = []
    run = Program.run
    monkeypatch.setattr(Program, "run", lambda self, *a, **k: (
        lambda out: steps.append(out.bounds["T"]) or out)(run(self, *a, **k)))
    for early in (True, None, False):
        assert tl.nn.generate(model, params, prompts, max_new_tokens=12, eos=stops,
                              early_stop=early) == want
    last = max(len(p) + len(r) for p, r in zip(prompts, want))
    assert steps == [last, last, 5 + 12]
    seen = []
    assert tl.nn.generate(model, params, prompts, max_new_tokens=12, eos=stops, early_stop=True,
                          stream=lambda row, i: seen.append((row, i))) == want
    assert [[i for r, i in seen if r == row] for row in (0, 1)] == want
    assert steps[-1] == last
    with pytest.raises(tl.ArgumentError, match="early_stop must be True, False or None") as err:
        tl.nn.generate(model, params, prompts, eos=stops, early_stop="yes")
    assert str(err.value).startswith(f"{__file__}:")


@pytest.mark.parametrize("bad", ["float", "vector", "over_t"])
def test_a_bad_start_is_a_located_error(bad):
    """``start=`` (each row's first real step) must be an int scalar per row, not varying
    over the step dim: else a ShapeError at the user's line that says so."""
    model = tl.nn.Llama(vocab=32, embed=16, layers=1, heads=2, kv_heads=1, hidden=32)
    ctx = tl.Context(dims=("b", "t", "n"))
    b, t, n = ctx.dims
    with ctx:
        ids = tl.from_array(np.zeros((2, 5), np.int32), domain=(b, t))
        start = {"float": tl.from_array(np.array([0.5, 1.0], np.float32), domain=(b,)),
                 "vector": tl.from_array(np.zeros((2, 3), np.int32), domain=(b,)),
                 "over_t": tl.from_array(np.zeros((2, 5), np.int32), domain=(b, t))}[bad]
        with pytest.raises(tl.ShapeError, match=r"test_generate\.py:\d+: .*start") as err:
            model(model.init(0), ids, t, n, start=start)
    assert ("varies over the step dim" in str(err.value)) == (bad == "over_t")
