"""transformers itself loads our exported directory and computes the same outputs (slow: it runs the
golden venv's torch; `make golden` creates that venv, and the test skips without it)."""

import json
import subprocess
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from bert_jax.interop import convert
from bert_jax.model.config import BertConfig
from bert_jax.model.models import BertForPreTraining, create

GOLDEN_PY = Path.home() / ".cache" / "bert_jax" / "golden-venv" / "bin" / "python"

SCRIPT = r"""
import json, sys, numpy as np, torch, transformers
d, ids, mask, seg = sys.argv[1], *(np.array(json.loads(a)) for a in sys.argv[2:5])
model = transformers.BertForPreTraining.from_pretrained(d).eval()
with torch.no_grad():
    out = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                token_type_ids=torch.tensor(seg))
np.savez(d + "/torch_out.npz", mlm=out.prediction_logits.numpy(), nsp=out.seq_relationship_logits.numpy())
"""


@pytest.mark.slow
def test_transformers_loads_our_export(tmp_path):
    if not GOLDEN_PY.exists():
        pytest.skip(f"{GOLDEN_PY} missing: run `make golden`")
    cfg = BertConfig.from_size("tiny", vocab_size=101, max_position_embeddings=16, num_heads=4)
    model = create(BertForPreTraining, cfg, seed=11)
    convert.export_hf(model, cfg, tmp_path)
    ids = np.random.default_rng(0).integers(1, 101, (2, 10))
    mask = np.ones_like(ids)
    mask[1, 6:] = 0
    seg = np.zeros_like(ids)
    seg[:, 5:] = 1
    subprocess.run([str(GOLDEN_PY), "-c", SCRIPT, str(tmp_path), *(json.dumps(a.tolist()) for a in (ids, mask, seg))],
                   check=True, capture_output=True, text=True)
    ref = np.load(tmp_path / "torch_out.npz")
    ours = nnx.jit(lambda m, *a: m(*a))(model, *(jnp.asarray(a, jnp.int32) for a in (ids, mask, seg)))
    real = mask.astype(bool)
    np.testing.assert_allclose(np.asarray(ours.mlm_logits)[real], ref["mlm"][real], atol=1e-4)
    np.testing.assert_allclose(ours.nsp_logits, ref["nsp"], atol=1e-4)
