"""Int8 head files (docs/spec.md §1.1): the stored values against a NumPy restatement of the
format, loading through both head readers, and damaged files named in clear errors."""
from __future__ import annotations

import json

import numpy as np
import pytest

from dart_jax.bench.tiny import make_tiny_eagle3, make_tiny_head, make_tiny_qwen3
from dart_jax.convert.__main__ import main as convert_main
from dart_jax.convert.dart_head import read_head
from dart_jax.convert.eagle3 import read_eagle3
from dart_jax.convert.safetensors_io import read_tensors, tensor_index, write_tensors
from dart_jax.errors import FileFormatError
from safetensors.numpy import load_file


def _oracle(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The format restated: per row, scale = max|w| / 127 (1 for zeros), q = round(w / scale)."""
    w = w.astype(np.float64)
    out_q, out_s = [], []
    for row in w:
        peak = max(abs(float(x)) for x in row)
        scale = peak / 127 if peak > 0 else 1.0
        out_s.append(scale)
        out_q.append([max(-127, min(127, round(float(x) / np.float32(scale)))) for x in row])
    return np.array(out_q), np.array(out_s)


@pytest.fixture(scope="module")
def heads(tmp_path_factory):
    root = tmp_path_factory.mktemp("int8")
    base = make_tiny_qwen3(root / "base", vocab_size=128, hidden_size=32, num_hidden_layers=4)
    dart = make_tiny_head(root / "dart", base, draft_vocab_size=64, head_dim=8, seed=1)
    eagle3 = make_tiny_eagle3(root / "eagle3", base, draft_vocab_size=64, head_dim=8, seed=2)
    return root, base, dart, eagle3


@pytest.mark.parametrize("kind", ["dart", "eagle3"])
def test_int8_copy_matches_the_format_and_loads(heads, kind, capsys):
    root, _, dart, eagle3 = heads
    src = dart if kind == "dart" else eagle3
    out = root / f"{kind}_int8"
    assert convert_main(["int8", str(src), str(out)]) == 0
    assert "int8" in capsys.readouterr().out
    original = read_tensors(src)
    raw = load_file(str(out / "model.safetensors"))
    assert json.loads((out / "config.json").read_text()) == json.loads((src / "config.json").read_text())
    for name, array in original.items():
        if array.ndim == 2:
            q, scale = _oracle(np.asarray(array, np.float32))
            assert raw[name].dtype == np.int8 and raw[name + "_scale"].shape == (array.shape[0], 1)
            np.testing.assert_array_equal(raw[name], q, err_msg=name)
            np.testing.assert_allclose(raw[name + "_scale"][:, 0], scale, rtol=1e-6)
        else:
            np.testing.assert_array_equal(raw[name], np.asarray(array))
    # the readers show the float view: q * scale, within half a step of the original
    loaded = read_tensors(out)
    assert set(loaded) == set(original)
    for name, array in original.items():
        if array.ndim == 2:
            step = np.max(np.abs(array), axis=1, keepdims=True) / 127
            assert np.all(np.abs(loaded[name] - array) <= step / 2 + 1e-7), name
    assert set(tensor_index(out)) == set(original)
    reader = read_head if kind == "dart" else read_eagle3
    _, _, tensors = reader(out)
    np.testing.assert_allclose(tensors[next(n for n in original if original[n].ndim == 2)],
                               loaded[next(n for n in original if original[n].ndim == 2)])


def test_int8_head_drafts_like_its_dequantized_float_copy(heads):
    """The int8 head, loaded by the model loader, equals a float head written with the values
    the format says it holds (q * scale, computed here in NumPy)."""
    import jax

    from dart_jax.convert.dart_head import read_head_config, write_dart_head
    from dart_jax.models.checkpoints import load_dart_head, load_target

    root, base, dart, _ = heads
    out = root / "dart_int8"
    if not out.exists():
        convert_main(["int8", str(dart), str(out)])
    raw = load_file(str(out / "model.safetensors"))
    float_copy = {n: (raw[n].astype(np.float64) * raw[n + "_scale"].astype(np.float64)).astype(np.float32)
                  if raw[n].dtype == np.int8 else raw[n] for n in raw if not n.endswith("_scale")}
    write_dart_head(root / "dart_deq", read_head_config(dart), float_copy, "float32")
    target = load_target(base)
    a = load_dart_head(out, target)
    b = load_dart_head(root / "dart_deq", target)
    for (pa, va), (pb, vb) in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree_util.tree_leaves_with_path(b)):
        np.testing.assert_allclose(np.asarray(va), np.asarray(vb), rtol=1e-6, atol=1e-7, err_msg=str(pa))


def test_damaged_int8_scales_are_named(heads, tmp_path):
    root, _, dart, _ = heads
    out = root / "dart_int8"
    if not out.exists():
        convert_main(["int8", str(dart), str(out)])
    raw = load_file(str(out / "model.safetensors"))
    bad = dict(raw)
    bad["fc.weight_scale"] = np.full_like(raw["fc.weight_scale"], np.nan)
    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / "config.json").write_text((out / "config.json").read_text())
    write_tensors(folder / "model.safetensors", bad)
    with pytest.raises(FileFormatError, match=r"fc\.weight_scale.*non-finite"):
        read_head(folder)
    # an int8 weight without its scale is not a float weight: refused, naming it
    del bad["fc.weight_scale"]
    write_tensors(folder / "model.safetensors", bad)
    with pytest.raises(FileFormatError, match=r"fc\.weight.*float"):
        read_head(folder)
