"""``tl.nn.AutoModel``: Qwen2, Mistral (a window shorter than the sequence) and GPT-2 checkpoints
written by ``transformers`` give its logits, its greedy tokens and its tokens under a
repetition penalty (``tests/fixtures/hf``, made by ``tests/fixtures/make_hf_checkpoints.py``);
what a model cannot honour is a located ``CheckpointError`` naming the field."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import tempo_lab as tl

HF = Path(__file__).parents[1] / "fixtures" / "hf"


def _logits(model, params, ids: np.ndarray) -> np.ndarray:
    ctx = tl.Context(dims=("b", "t", "n"))
    b, t, n = ctx.dims
    B, T, N = ctx.bounds
    with ctx:
        logits = model(params, tl.from_array(ids, domain=(b, t)), t, n)
    bounds = {B: ids.shape[0], T: ids.shape[1], N: model.layers}
    return ctx.compile(bounds=bounds, outputs={"logits": logits}).run()["logits"]


@pytest.mark.parametrize("name, kind", [("qwen2_bias", tl.nn.Llama),
                                        ("mistral_window", tl.nn.Llama),
                                        ("gpt2_tiny", tl.nn.GPT2),
                                        ("llama3_tied", tl.nn.Llama)])
def test_a_checkpoint_gives_what_transformers_gives(name, kind):
    model, params = tl.nn.AutoModel.from_pretrained(HF / name)
    assert type(model) is kind
    expected = np.load(HF / name / "expected.npz")
    np.testing.assert_allclose(_logits(model, params, expected["ids"]), expected["logits"],
                               rtol=1e-4, atol=1e-4)
    prompts = expected["prompt"].tolist()
    assert tl.nn.generate(model, params, prompts, max_new_tokens=20) == \
        expected["greedy"].tolist()
    if "greedy_penalised" in expected:
        assert tl.nn.generate(model, params, prompts, max_new_tokens=20,
                              repetition_penalty=1.5) == expected["greedy_penalised"].tolist()


def test_what_each_architecture_reads():
    qwen, p = tl.nn.AutoModel.from_pretrained(HF / "qwen2_bias")
    assert qwen.qkv_bias and qwen.rope_base == 1e6 and qwen.window is None
    assert p["layers.attn.bq"].shape == (2, 32) and np.abs(p["layers.attn.bq"]).max() > 0
    mistral, _ = tl.nn.AutoModel.from_pretrained(HF / "mistral_window")
    assert mistral.window == 8 and mistral.head_dim == 8 and not mistral.qkv_bias
    gpt2, p = tl.nn.AutoModel.from_pretrained(HF / "gpt2_tiny")
    assert (gpt2.positions, gpt2.hidden) == (64, 128)
    assert p["layers.attn.w_qkv"].shape == (2, 32, 96)   # (in, out), as Conv1D stores it
    with pytest.raises(tl.ArgumentError, match="need 70 positions but GPT2 has 64"):
        tl.nn.generate(gpt2, p, [[1] * 60], max_new_tokens=10)


def test_gpt2_files_without_the_transformer_prefix(tmp_path):
    from safetensors.numpy import load_file, save_file

    shutil.copy(HF / "gpt2_tiny" / "config.json", tmp_path)
    tensors = load_file(HF / "gpt2_tiny" / "model.safetensors")
    bare = {k.removeprefix("transformer."): v for k, v in tensors.items()}
    bare["h.0.attn.bias"] = np.tril(np.ones((1, 1, 64, 64), np.float32))  # the old mask buffer
    save_file(bare, tmp_path / "model.safetensors")
    _, want = tl.nn.AutoModel.from_pretrained(HF / "gpt2_tiny")
    _, got = tl.nn.AutoModel.from_pretrained(tmp_path)
    assert got.keys() == want.keys()
    assert all(np.array_equal(got[k], want[k]) for k in want)


def _edited(tmp_path, name, **fields) -> Path:
    shutil.copytree(HF / name, tmp_path / name)
    cfg = json.loads((tmp_path / name / "config.json").read_text())
    for k, v in fields.items():
        if v is KeyError:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (tmp_path / name / "config.json").write_text(json.dumps(cfg))
    return tmp_path / name


@pytest.mark.parametrize("name, fields, match", [
    ("qwen2_bias", {"model_type": "phi3"}, "field 'model_type' is 'phi3'; tl.nn.AutoModel reads"),
    ("qwen2_bias", {"model_type": KeyError}, "field 'model_type' is missing"),
    ("qwen2_bias", {"layer_types": ["full_attention", "sliding_attention"]}, "mixes"),
    ("qwen2_bias", {"layer_types": KeyError, "use_sliding_window": True,
                    "max_window_layers": 1, "sliding_window": 4}, "max_window_layers 1"),
    ("mistral_window", {"sliding_window": float("nan")}, "field 'sliding_window' is nan"),
    ("mistral_window", {"sliding_window": 0}, "field 'sliding_window' is 0"),
    ("gpt2_tiny", {"activation_function": "relu"}, "activation_function is 'relu'"),
    ("gpt2_tiny", {"tie_word_embeddings": False}, "tie_word_embeddings is False"),
    ("gpt2_tiny", {"n_positions": 1e400}, "field 'n_positions' is inf"),
    ("gpt2_tiny", {"n_head": 5}, "multiple of heads 5"),
    ("gpt2_tiny", {"layer_norm_epsilon": -1}, "field 'layer_norm_epsilon' is -1"),
])
def test_a_config_a_model_cannot_honour_is_named(tmp_path, name, fields, match):
    path = _edited(tmp_path, name, **fields)
    with pytest.raises(tl.CheckpointError, match=match) as err:
        tl.nn.AutoModel.from_pretrained(path)
    assert str(err.value).startswith(f"{__file__}:")


def test_sliding_window_from_qwen2s_own_fields(tmp_path):
    path = _edited(tmp_path, "qwen2_bias", layer_types=KeyError, use_sliding_window=True,
                   max_window_layers=0, sliding_window=6)
    model, _ = tl.nn.AutoModel.from_pretrained(path)
    assert model.window == 6


def test_llama_from_pretrained_points_other_checkpoints_to_automodel():
    with pytest.raises(tl.CheckpointError, match="AutoModel.from_pretrained reads llama, qwen2"):
        tl.nn.Llama.from_pretrained(HF / "qwen2_bias")
    with pytest.raises(tl.ArgumentError, match="got NoneType"):
        tl.nn.AutoModel.from_pretrained(None)
