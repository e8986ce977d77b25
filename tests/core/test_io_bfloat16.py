"""bfloat16 in checkpoints: core stores the raw bits without importing
ml_dtypes, and needs ml_dtypes (everyo-core[amp]) only to hand them back."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from io_files import same

import everyo as eo

ml_dtypes = pytest.importorskip("ml_dtypes")  # optional: everyo-amp's dependency; in the core cell's deps
BF16 = ml_dtypes.bfloat16

# Every kind of bfloat16 value: zeros of both signs, subnormals, normals, infinities, NaNs.
BITS = np.array(
    [0x0000, 0x8000, 0x0001, 0x807F, 0x3F80, 0xC2F7, 0x7F7F, 0x7F80, 0xFF80, 0x7FC0, 0xFFC1], dtype=np.uint16
)


def test_bfloat16_arrays_and_scalars_round_trip_bit_for_bit(tmp_path):
    state = {"w": BITS.view(BF16).reshape(1, 11), "s": BF16(1.5), "t": np.asfortranarray(np.ones((2, 3), BF16))}
    path = tmp_path / "b.npz"
    eo.save(state, path)
    back = eo.load(path)
    assert same(back, state) and back["w"].dtype == BF16 and type(back["s"]) is BF16
    assert back["t"].flags.f_contiguous


def test_the_file_holds_uint16_bits_and_says_bfloat16(tmp_path):
    path = tmp_path / "b.npz"
    eo.save({"w": BITS.view(BF16)}, path)
    with np.load(path, allow_pickle=False) as archive:
        assert archive["a0"].dtype == np.uint16 and np.array_equal(archive["a0"], BITS)
        tree = json.loads(archive["__everyo_manifest__"].tobytes())["tree"]
    assert tree["items"][0][1]["dtype"] == "bfloat16"


def test_without_ml_dtypes_loading_says_what_to_install(tmp_path, monkeypatch):
    path = tmp_path / "b.npz"
    eo.save({"w": BITS.view(BF16)}, path)
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)
    with pytest.raises(eo.EveryOSerializationError, match=r"b\.npz holds bfloat16.*pip install everyo-core\[amp\]"):
        eo.load(path)


def test_a_bfloat16_model_checkpoint_resumes(tmp_path):
    model = eo.Linear(4, 3, seed=0).to("float32")
    state = {k: v.astype(BF16) for k, v in model.state_dict().items()}
    eo.save({"model": state}, tmp_path / "m.npz")
    back = eo.load(tmp_path / "m.npz")["model"]
    fresh = eo.Linear(4, 3, seed=1)
    fresh.load_state_dict(back)
    assert np.array_equal(fresh.weight.data, state["weight"].astype(np.float32))


def test_other_ml_dtypes_are_refused_clearly(tmp_path):
    with pytest.raises(eo.EveryOSerializationError, match="float8_e4m3fn"):
        eo.save({"w": np.zeros(2, ml_dtypes.float8_e4m3fn)}, tmp_path / "f8.npz")


def test_bfloat16_in_safetensors_is_bf16(tmp_path):
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    path = tmp_path / "b.safetensors"
    eo.save({"w": BITS.view(BF16)}, path)
    header = json.loads(path.read_bytes()[8 : 8 + int.from_bytes(path.read_bytes()[:8], "little")])
    assert header["w"]["dtype"] == "BF16"
    back = eo.load(path)["w"]
    assert back.dtype == BF16 and np.array_equal(back.view(np.uint16), BITS)
    del safetensors_numpy


def test_core_imports_neither_ml_dtypes_nor_safetensors(tmp_path):
    code = (
        "import sys, numpy as np, everyo as eo; eo.save({'w': np.ones(2)}, sys.argv[1]); eo.load(sys.argv[1]);"
        "print(sorted(m for m in ('ml_dtypes', 'safetensors') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "c.npz")],
        capture_output=True,
        text=True,
        env=os.environ.copy(),
        check=True,
    )
    assert out.stdout.strip() == "[]"
