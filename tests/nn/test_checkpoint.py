"""Hugging Face checkpoints: ``tl.nn.Llama.from_pretrained`` against what ``transformers``
computed on the same files (``tests/fixtures/make_hf_checkpoints.py`` made them; neither
``transformers`` nor ``torch`` is needed here), the real Llama-3.2-1B ``config.json``, and every
way a checkpoint can fail to fit: a located ``CheckpointError`` naming the file and field."""
from __future__ import annotations

import dataclasses
import json
import shutil
import struct
import sys
from pathlib import Path

import jax
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.numpy import load_file, save_file

import tempo_lab as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ is not a package
from budget import examples  # noqa: E402

HF = Path(__file__).parents[1] / "fixtures" / "hf"
CONFIGS = Path(__file__).parents[1] / "fixtures" / "configs"
FIXTURES = ("llama3_tied", "untied_bf16", "sharded_v4")


def _decode(model, params, expected, steps=25):
    ctx = tl.Context(dims=("b", "n", "t"))
    b, n, t = ctx.dims
    B, N, T = ctx.bounds
    with ctx:
        logits = model(params, tl.from_array(expected["ids"], domain=(b, t)), t, n)
        ids, _ = model.generate(params, tl.from_array(expected["prompt"], domain=(b,)), t, n)
    bounds = {B: 2, N: model.layers}
    with jax.default_matmul_precision("highest"):  # a GPU's default is TF32 (1e-3)
        got = ctx.compile(bounds={**bounds, T: expected["ids"].shape[1]},
                          outputs={"logits": logits}).run()["logits"]
        tokens = ctx.compile(bounds={**bounds, T: steps}, outputs={"ids": ids}).run()["ids"]
    return got, tokens[:, expected["prompt"].shape[1]:]


@pytest.mark.parametrize("name", FIXTURES)
def test_a_checkpoint_matches_transformers(name):
    model, params = tl.nn.Llama.from_pretrained(HF / name)
    expected = np.load(HF / name / "expected.npz")
    logits, greedy = _decode(model, params, expected)
    np.testing.assert_allclose(logits, expected["logits"], rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(greedy, expected["greedy"])


def test_the_config_is_read_in_both_layouts_and_the_dtype_is_kept():
    tied, p = tl.nn.Llama.from_pretrained(HF / "llama3_tied")           # transformers 5
    assert tied.tied and tied.rope_base == 10000.0 and "head.w" not in p
    assert tied.rope_scaling == tl.nn.RopeScaling(8.0, 1.0, 4.0, 32)
    v4, p4 = tl.nn.Llama.from_pretrained(HF / "sharded_v4")             # transformers 4, shards
    assert (v4.layers, v4.tied, v4.rope_base) == (3, False, 500000.0)
    assert v4.rope_scaling == tied.rope_scaling and p4["head.w"].shape == (96, 32)
    bf, pb = tl.nn.Llama.from_pretrained(HF / "untied_bf16")
    assert bf.head_dim == 16 and bf.rope_scaling is None
    assert pb["layers.attn.wq"].shape == (2, 64, 32) and pb["layers.attn.wo"].shape == (2, 32, 64)
    assert {v.dtype for v in pb.values()} == {np.dtype(ml_dtypes.bfloat16)}
    _, p32 = tl.nn.Llama.from_pretrained(HF / "untied_bf16", dtype="float32")
    assert {v.dtype for v in p32.values()} == {np.dtype(np.float32)}
    np.testing.assert_array_equal(p32["embed.w"], pb["embed.w"].astype(np.float32))
    assert all(v.ctypes.data % 64 == 0 for v in pb.values())  # used in place by JAX


def test_the_rope_scaling_changes_the_logits():
    """Without Llama 3's scaling (as before it was read) the logits are off: the fixture
    checks the scaling, not only the rest of the model."""
    model, params = tl.nn.Llama.from_pretrained(HF / "llama3_tied")
    expected = np.load(HF / "llama3_tied" / "expected.npz")
    plain = dataclasses.replace(model, rope_scaling=None)
    logits, _ = _decode(plain, params, expected, steps=6)
    assert np.abs(logits - expected["logits"]).max() > 1e-2


def test_the_real_llama_3_2_1b_config():
    cfg = tl.nn.checkpoint.read_config(CONFIGS / "llama-3.2-1b.json")
    model = tl.nn.checkpoint.llama_from_config(cfg)
    assert model == tl.nn.Llama(128256, 2048, 16, 32, 8, 8192, rope_base=500000.0, eps=1e-5,
                                tied=True, head_dim=64,
                                rope_scaling=tl.nn.RopeScaling(32.0, 1.0, 4.0, 8192))
    freq = tl.nn.rope_frequencies(64, 500000.0, model.rope_scaling)
    plain = tl.nn.rope_frequencies(64, 500000.0)
    assert freq[0] == plain[0] and freq[-1] == pytest.approx(plain[-1] / 32)


def _copy(tmp_path, name="llama3_tied") -> Path:
    dst = tmp_path / name
    shutil.copytree(HF / name, dst)
    return dst


def _edit_config(path: Path, **changes):
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(changes)
    (path / "config.json").write_text(json.dumps(cfg))


def _raises(fn, *match):
    with pytest.raises(tl.CheckpointError) as e:
        fn()
    text = str(e.value)
    assert text.startswith(f"{__file__}:"), text        # located at the user's call
    for m in match:
        assert m in text, (m, text)
    return text


@pytest.mark.parametrize("field,value,named", [
    ("attention_bias", True, "attention_bias"),
    ("mlp_bias", True, "mlp_bias"),
    ("hidden_act", "gelu", "hidden_act"),
    ("model_type", "mistral", "model_type"),
    ("rope_parameters", {"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0}, "yarn"),
    ("rope_parameters", {"rope_type": "llama3", "rope_theta": 1e4}, "rope_parameters.factor"),
    ("num_hidden_layers", "2", "num_hidden_layers"),
    ("vocab_size", None, "vocab_size"),
])
def test_a_config_field_it_cannot_honour_is_named(tmp_path, field, value, named):
    path = _copy(tmp_path)
    _edit_config(path, **{field: value})
    _raises(lambda: tl.nn.Llama.from_pretrained(path), "config.json", named)


def test_a_config_that_says_more_layers_than_the_files_hold_is_refused_at_once(tmp_path):
    """Checked before a name is listed per layer: 10**12 layers (a tampered config) once
    listed every layer's tensor names, growing until the process was killed. 10**12 is now
    past the field's range; 2**31 - 1, the most a config may say, is refused at once too."""
    path = _copy(tmp_path)
    _edit_config(path, num_hidden_layers=2**31 - 1)
    _raises(lambda: tl.nn.Llama.from_pretrained(path), "model.layers.2.input_layernorm",
            "it has 2 layers")


def test_files_that_do_not_fit_are_named(tmp_path):
    _raises(lambda: tl.nn.Llama.from_pretrained(tmp_path / "nowhere"), "nowhere")
    (tmp_path / "empty").mkdir()
    _raises(lambda: tl.nn.Llama.from_pretrained(tmp_path / "empty"), "config.json")
    path = _copy(tmp_path)
    (path / "config.json").write_text("{not json")
    _raises(lambda: tl.nn.Llama.from_pretrained(path), "config.json", "JSON")

    path = _copy(tmp_path / "a")
    weights = path / "model.safetensors"
    data = weights.read_bytes()
    for broken in (b"", data[:len(data) // 2], b"\x08" + data[1:64]):
        weights.write_bytes(broken)
        _raises(lambda: tl.nn.Llama.from_pretrained(path), "model.safetensors")

    path = _copy(tmp_path / "b", "sharded_v4")
    (path / "model-00002-of-00004.safetensors").unlink()
    _raises(lambda: tl.nn.Llama.from_pretrained(path), "model-00002-of-00004")
    (path / "model.safetensors.index.json").write_text('{"weight_map": 3}')
    _raises(lambda: tl.nn.Llama.from_pretrained(path), "model.safetensors.index.json")


def test_tensors_that_do_not_fit_the_model_are_named(tmp_path):
    path = _copy(tmp_path)
    tensors = load_file(path / "model.safetensors")
    model, _ = tl.nn.Llama.from_pretrained(path)
    extra = {**tensors, "lm_head.weight": tensors["model.embed_tokens.weight"]}
    save_file(extra, path / "model.safetensors")
    _raises(lambda: tl.nn.Llama.from_pretrained(path), "lm_head.weight", "untied")
    # an untied head is read when the model says so
    got = tl.nn.load_llama(path, dataclasses.replace(model, tied=False))
    np.testing.assert_array_equal(got["head.w"], tensors["model.embed_tokens.weight"])

    fewer = dataclasses.replace(model, layers=1)
    save_file(tensors, path / "model.safetensors")
    _raises(lambda: tl.nn.load_llama(path, fewer), "model.layers.1.", "more layers")
    more = dataclasses.replace(model, layers=3)
    _raises(lambda: tl.nn.load_llama(path, more), "model.layers.2.", "needs")
    narrow = dataclasses.replace(model, kv_heads=4)
    _raises(lambda: tl.nn.load_llama(path, narrow), "k_proj", "shape")
    ints = {**tensors, "model.norm.weight": np.arange(32, dtype=np.int32)}
    save_file(ints, path / "model.safetensors")
    _raises(lambda: tl.nn.load_llama(path, model), "model.norm.weight", "dtype")


SHARDED = "sharded_v4"
SHARD = "model-0000{}-of-00004.safetensors"   # model.norm.weight is in shard 3, by the index


def _add_tensor(file: Path, name: str, value: np.ndarray):
    save_file({**load_file(file), name: value}, file)


def test_a_tensor_in_two_shards_is_an_error_naming_both(tmp_path):
    """The index is the authority on which shard holds a tensor: a second copy of
    ``model.norm.weight`` in shard 4 once won over the indexed one in shard 3 (the norm read
    as 2.0 where the index's shard holds 1.0), with no error."""
    path = _copy(tmp_path, SHARDED)
    norm = load_file(path / SHARD.format(3))["model.norm.weight"]
    _add_tensor(path / SHARD.format(4), "model.norm.weight", np.full_like(norm, 2.0))
    _raises(lambda: tl.nn.Llama.from_pretrained(path), "'model.norm.weight'",
            SHARD.format(3), SHARD.format(4))
    files = sorted(path.glob("*.safetensors"))      # the shards given as a list: no index
    model, _ = tl.nn.Llama.from_pretrained(HF / SHARDED)
    _raises(lambda: tl.nn.load_llama(files, model), "'model.norm.weight'", "also in",
            SHARD.format(3), SHARD.format(4))


def test_a_tensor_where_the_index_does_not_say_is_an_error(tmp_path):
    path = _copy(tmp_path, SHARDED)
    index = path / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    data["weight_map"]["model.norm.weight"] = SHARD.format(4)       # it is in shard 3
    index.write_text(json.dumps(data))
    _raises(lambda: tl.nn.Llama.from_pretrained(path), "'model.norm.weight'", "puts it in",
            SHARD.format(3), SHARD.format(4))
    del data["weight_map"]["model.norm.weight"]                     # not listed at all
    index.write_text(json.dumps(data))
    _raises(lambda: tl.nn.Llama.from_pretrained(path), "'model.norm.weight'",
            "does not list it")
    data["weight_map"]["model.norm.weight"] = SHARD.format(3)       # listed, but not there
    data["weight_map"]["model.layers.9.mlp.up_proj.weight"] = SHARD.format(2)
    index.write_text(json.dumps(data))
    _raises(lambda: tl.nn.Llama.from_pretrained(path), "'model.layers.9.mlp.up_proj.weight'",
            SHARD.format(2), "does not hold it")


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("name,field,value,rule", [
    ("llama3_tied", "rope_parameters.rope_theta", NAN, "a finite number > 1"),
    ("llama3_tied", "rope_parameters.rope_theta", 10**300, "a finite number > 1"),
    ("llama3_tied", "rope_parameters.rope_theta", 1e39, "<= 3.403e+38"),
    ("sharded_v4", "rope_theta", -INF, "a finite number > 1"),
    ("sharded_v4", "rope_theta", 1, "a finite number > 1"),
    ("sharded_v4", "rope_scaling.original_max_position_embeddings", INF, "an int in [1, "),
    ("sharded_v4", "rope_scaling.original_max_position_embeddings", NAN, "an int in [1, "),
    ("sharded_v4", "rope_scaling.original_max_position_embeddings", 8192.5, "an int in [1, "),
    ("llama3_tied", "rope_parameters.factor", NAN, "a finite number > 0"),
    ("llama3_tied", "rope_parameters.low_freq_factor", INF, "a finite number > 0"),
    ("llama3_tied", "rms_norm_eps", NAN, "a finite number > 0"),
    ("llama3_tied", "rms_norm_eps", 0.0, "a finite number > 0"),
    ("llama3_tied", "vocab_size", 2**31, "an int in [1, 2147483647]"),
    ("llama3_tied", "head_dim", INF, "an int in [1, "),
    ("untied_bf16", "num_key_value_heads", -2, "an int in [1, "),
], ids=lambda v: str(v)[:24])
def test_every_numeric_field_is_checked_finite_and_in_range(tmp_path, name, field, value,
                                                            rule):
    """``rope_theta: NaN`` once loaded (every logit NaN); an ``Infinity`` or ``NaN``
    ``original_max_position_embeddings`` raised ``OverflowError`` or ``ValueError``. The error
    names the field as the file spells it, its value and the rule."""
    path = _copy(tmp_path, name)
    cfg = json.loads((path / "config.json").read_text())
    *outer, last = field.split(".")
    (cfg[outer[0]] if outer else cfg)[last] = value
    (path / "config.json").write_text(json.dumps(cfg))
    text = _raises(lambda: tl.nn.Llama.from_pretrained(path), "config.json", f"{field!r}",
                   rule)
    assert repr(value)[:20] in text


def test_a_json_file_nested_deeply_or_with_a_huge_number_is_named(tmp_path):
    """A ``config.json`` or index nested 100 000 deep once raised ``RecursionError``, a
    5 000-digit integer ``ValueError``; a key given twice was read as its last value."""
    path = _copy(tmp_path, SHARDED)
    for file in ("config.json", "model.safetensors.index.json"):
        good = (path / file).read_text()
        for text, why in (("[" * 100_000 + "]" * 100_000, "nested too deeply"),
                          ("[" * 101 + "]" * 101, "101 levels"),
                          ('{"vocab_size": 1' + "0" * 5000 + "}", "5001 digits"),
                          ('{"vocab_size": 96, "vocab_size": 97}', "'vocab_size' twice"),
                          ("[1, 2]", "JSON array where a JSON object"),
                          (good[:len(good) // 2], "not JSON")):
            (path / file).write_text(text)
            _raises(lambda: tl.nn.Llama.from_pretrained(path), file, why)
        (path / file).write_text(good)
    tl.nn.Llama.from_pretrained(path)


@pytest.mark.parametrize("arg", [None, 3, 2.5, b"ckpt", ["a"], "ckpt\0dir"])
def test_from_pretrained_of_something_not_a_path_is_an_argument_error(arg):
    with pytest.raises(tl.ArgumentError) as e:
        tl.nn.Llama.from_pretrained(arg)
    assert str(e.value).startswith(f"{__file__}:") and "from_pretrained" in str(e.value)


def test_entry_points_refuse_what_is_not_a_checkpoint_as_located_errors(tmp_path):
    with pytest.raises(tl.ArgumentError, match="signature"):
        tl.nn.Llama.from_pretrained()
    model, _ = tl.nn.Llama.from_pretrained(HF / "llama3_tied")
    for call in (lambda: tl.nn.load_llama(None, model), lambda: tl.nn.load_llama(3, model),
                 lambda: tl.nn.load_llama([], model),
                 lambda: tl.nn.load_llama(HF / "llama3_tied", None)):
        with pytest.raises(tl.ArgumentError) as e:
            call()
        assert str(e.value).startswith(f"{__file__}:"), e.value
    _raises(lambda: tl.nn.Llama.from_pretrained(tmp_path / ("x" * 300)), "cannot be read")


HOSTILE = [None, -1, 0, 10**12, 1.5, "x", [], {}, True, 1e308, [0], [-1], [10**12], [3, 2],
           [0, 10**15], "F64", "I8", "BOOL"]


NUMERIC = ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
           "num_key_value_heads", "intermediate_size", "head_dim", "rms_norm_eps", "rope_theta",
           "rope_scaling.factor", "rope_parameters.factor", "rope_parameters.rope_theta",
           "rope_parameters.original_max_position_embeddings", "rope_scaling.low_freq_factor",
           "rope_scaling.original_max_position_embeddings"]   # those present are all read
NUMBERS = [NAN, INF, -INF, 10**300, 1e39, 0, -1, 2**31, 0.5, 8192.5, 3]
JSON_DAMAGE = ["config field", "numeric field", "nesting", "huge int", "key twice"]


def _damage_json(path: Path, data) -> bool:
    """One of the checkpoint's JSON files damaged as ``data`` draws; whether it must be
    refused (a NaN or infinite number the model reads, nesting past the reader's 100 levels,
    an integer past its 400 digits, a key given twice)."""
    files = ["config.json"] + (["model.safetensors.index.json"] if (
        path / "model.safetensors.index.json").exists() else [])
    how = data.draw(st.sampled_from(JSON_DAMAGE), label="json damage")
    target = path / data.draw(st.sampled_from(files if how != "numeric field" else files[:1]),
                              label="json file")
    obj = json.loads(target.read_text())
    must_fail, raw = False, None
    if how == "config field":
        obj[data.draw(st.sampled_from(sorted(obj)))] = data.draw(st.sampled_from(HOSTILE))
    elif how == "numeric field":
        *outer, last = data.draw(st.sampled_from(NUMERIC), label="field").split(".")
        inner = obj.get(outer[0]) if outer else obj
        if isinstance(inner, dict) and last in inner:
            inner[last] = value = data.draw(st.sampled_from(NUMBERS), label="value")
            must_fail = isinstance(value, float) and not np.isfinite(value)
    elif how == "nesting":
        depth = data.draw(st.sampled_from([1, 50, 98, 101, 5000, 100_000]), label="depth")
        obj["deep"] = "@"
        raw = json.dumps(obj).replace('"@"', "[" * depth + "]" * depth)
        must_fail = depth + 1 > 100
    elif how == "huge int":
        digits = data.draw(st.sampled_from([19, 400, 401, 5000]), label="digits")
        obj[data.draw(st.sampled_from(sorted(obj)))] = "@"
        raw = json.dumps(obj).replace('"@"', "7" * digits)
        must_fail = digits > 400
    else:
        key = data.draw(st.sampled_from(sorted(obj)))
        raw = json.dumps(obj)[:-1] + f", {json.dumps(key)}: {json.dumps(obj[key])}}}"
        must_fail = True
    target.write_text(raw if raw is not None else json.dumps(obj))
    return must_fail


def _duplicate(path: Path, file: Path, data) -> None:
    """A tensor of shard ``file`` copied, changed, into another shard."""
    other = data.draw(st.sampled_from([f for f in sorted(path.glob("*.safetensors"))
                                       if f != file]), label="into")
    tensors = load_file(file)
    name = data.draw(st.sampled_from(sorted(tensors)), label="tensor")
    _add_tensor(other, name, tensors[name] + 1)


@settings(max_examples=examples(900), deadline=None, derandomize=True, database=None)
@given(st.data())
def test_a_checkpoint_damaged_anywhere_loads_or_is_a_located_error(tmp_path_factory, data):
    """A safetensors file cut short, emptied, with a byte of its header changed, a header
    length past the file, or a tensor's shape, dtype or offsets edited; a tensor copied into a
    second shard; a ``config.json`` or index field replaced, a numeric field made NaN, infinite
    or out of range, nesting or an integer past the reader's limits, a key given twice:
    ``from_pretrained`` gives a model or a CheckpointError located at the caller that names
    the checkpoint. Never another exception, and never a model where the files are ambiguous
    or a number the model reads is not finite."""
    path = _copy(tmp_path_factory.mktemp("ckpt"), data.draw(st.sampled_from(FIXTURES)))
    file = data.draw(st.sampled_from(sorted(path.glob("*.safetensors"))), label="file")
    raw = bytearray(file.read_bytes())
    size = struct.unpack("<Q", raw[:8])[0]
    kinds = ["cut", "empty", "header byte", "header length", "tensor field", "json"]
    how = data.draw(st.sampled_from(kinds + (["duplicate"] if file.name != "model.safetensors"
                                             else [])), label="damage")
    must_fail = how == "duplicate"
    if how == "cut":
        raw = raw[:data.draw(st.integers(0, len(raw) - 1), label="length")]
    elif how == "empty":
        raw = b""
    elif how == "header byte":
        raw[data.draw(st.integers(8, 7 + size))] = data.draw(st.integers(0, 255))
    elif how == "header length":
        raw[:8] = struct.pack("<Q", data.draw(st.sampled_from([0, 1, size - 1, size + 1,
                                                               2**40, 2**64 - 1])))
    elif how == "tensor field":
        header = json.loads(raw[8:8 + size])
        name = data.draw(st.sampled_from(sorted(k for k in header if k != "__metadata__")))
        field = data.draw(st.sampled_from(["shape", "dtype", "data_offsets"]))
        header[name][field] = data.draw(st.sampled_from(HOSTILE), label="value")
        text = json.dumps(header).encode()
        raw = struct.pack("<Q", len(text)) + text + raw[8 + size:]
    elif how == "duplicate":
        _duplicate(path, file, data)
    else:
        must_fail = _damage_json(path, data)
    file.write_bytes(bytes(raw))
    try:
        tl.nn.Llama.from_pretrained(path)
    except tl.CheckpointError as err:
        assert str(err).startswith(f"{__file__}:") and str(path) in str(err), err
    else:
        assert not must_fail, f"{how}: loaded"
