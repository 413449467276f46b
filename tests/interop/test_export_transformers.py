"""transformers itself loads our exported directories (BERT, ALBERT, ELECTRA, RoBERTa) and computes the
same outputs (slow: it runs the golden venv's torch; `make golden` creates that venv, and the tests
skip without it)."""

import json
import subprocess
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from bert_jax.interop import convert, pretrained
from bert_jax.model.config import BertConfig
from bert_jax.model.electra import ElectraDiscriminator
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


FAMILY_SCRIPT = r"""
import json, sys, numpy as np, torch, transformers
for d in sys.argv[1:]:
    arch = json.load(open(d + "/config.json"))["architectures"][0]
    model, info = getattr(transformers, arch).from_pretrained(d, output_loading_info=True)
    x = np.load(d + "/inputs.npz")
    with torch.no_grad():
        out = model.eval()(**{k: torch.tensor(x[k], dtype=torch.long) for k in x.files})
    np.savez(d + "/torch_out.npz", **{k: v.numpy() for k, v in out.items() if torch.is_tensor(v)})
    json.dump({k: sorted(map(str, v)) for k, v in info.items()}, open(d + "/loading_info.json", "w"))
"""
# network -> {our output: the HF output's name}
HF_OUTPUTS = {"albert": {"mlm": "prediction_logits", "pair": "sop_logits"},
              "electra_discriminator": {"rtd": "logits"},
              "electra_generator": {"mlm": "logits"},
              "roberta": {"mlm": "logits"}}


@pytest.mark.slow
def test_transformers_loads_family_exports(family_golden, tmp_path):
    """The golden's model of each family, every parameter perturbed, exported: HF's
    ``from_pretrained`` finds every weight it needs and computes our logits (1e-4, real positions)."""
    if not GOLDEN_PY.exists():
        pytest.skip(f"{GOLDEN_PY} missing: run `make golden`")
    ours, dirs = {}, []
    for i, network in enumerate(HF_OUTPUTS):
        g = family_golden(network)
        ckpt = pretrained.read_checkpoint(f"hf:{g.directory}")
        model = pretrained.build_model(ckpt)  # the golden's architecture and weights, perturbed below
        params = nnx.state(model, nnx.Param)
        leaves, tree = jax.tree.flatten(params)
        keys = jax.random.split(jax.random.key(i), len(leaves))
        nnx.update(model, jax.tree.unflatten(tree, [p + 0.1 * jax.random.normal(k, p.shape) for p, k in
                                                    zip(leaves, keys, strict=True)]))
        d = tmp_path / network
        convert.export_hf(model, ckpt.config, d)
        ids, mask, seg = g.inputs
        np.savez(d / "inputs.npz", input_ids=ids, attention_mask=mask, token_type_ids=seg)
        out = nnx.jit(lambda m, *a: m(*a))(model, *(jnp.asarray(a) for a in g.inputs))
        if isinstance(model, ElectraDiscriminator):
            ours[network] = {"rtd": np.asarray(out)}
        else:
            ours[network] = {"mlm": np.asarray(out.mlm_logits)}
            if out.nsp_logits is not None:
                ours[network]["pair"] = np.asarray(out.nsp_logits)
        dirs.append(str(d))
    run = subprocess.run([str(GOLDEN_PY), "-c", FAMILY_SCRIPT, *dirs], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    for network, names in HF_OUTPUTS.items():
        d = tmp_path / network
        info = json.loads((d / "loading_info.json").read_text())
        assert info["missing_keys"] == [] and info["mismatched_keys"] == [], (network, info)
        ref = np.load(d / "torch_out.npz")
        real = family_golden(network).inputs[1].astype(bool)
        assert ours[network].keys() == names.keys()
        for k, hf_name in names.items():
            a, b = ours[network][k], ref[hf_name]
            if b.shape[:2] == real.shape:
                a, b = a[real], b[real]
            np.testing.assert_allclose(a, b, atol=1e-4, err_msg=f"{network} {k}")
