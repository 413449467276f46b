"""The BERT family's goldens (tests/golden/*_golden.npz, `make golden`) as Hugging Face directories."""

import json
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest

# network -> (golden file, key prefix in it, {our output name: golden key})
NETWORKS = {
    "albert": ("albert_golden.npz", "", {"hidden": "last_hidden_state", "pooled": "pooler_output",
                                         "mlm": "prediction_logits", "pair": "sop_logits"}),
    "electra_discriminator": ("electra_golden.npz", "disc_", {"hidden": "disc_last_hidden_state",
                                                              "rtd": "disc_logits"}),
    "electra_generator": ("electra_golden.npz", "gen_", {"hidden": "gen_last_hidden_state", "mlm": "gen_logits"}),
    "roberta": ("roberta_golden.npz", "", {"hidden": "last_hidden_state", "pooled": "pooler_output",
                                           "mlm": "prediction_logits"}),
}


class FamilyGolden(NamedTuple):
    directory: Path  # config.json + model.safetensors, as save_pretrained wrote them
    tensors: dict[str, np.ndarray]  # HF name -> array
    config: dict  # config.json
    inputs: tuple[np.ndarray, np.ndarray, np.ndarray]  # input_ids, attention_mask, token_type_ids [3, 12]
    outputs: dict[str, np.ndarray]  # hidden, pooled, mlm, pair, rtd (those the network has)


@pytest.fixture(scope="session")
def family_golden(golden_file, tmp_path_factory):
    """``family_golden("albert")`` -> `FamilyGolden`, its directory written once per session."""
    cache = {}

    def load(network: str) -> FamilyGolden:
        if network not in cache:
            from safetensors.numpy import save_file

            name, prefix, outputs = NETWORKS[network]
            g = np.load(golden_file(name), allow_pickle=False)
            tensors = {k.removeprefix(f"{prefix}tensor/"): g[k] for k in g.files if k.startswith(f"{prefix}tensor/")}
            config = json.loads(str(g[f"{prefix}config_json"]))
            d = tmp_path_factory.mktemp(network)
            save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
            (d / "config.json").write_text(json.dumps(config))
            inputs = tuple(g[k] for k in ("input_ids", "attention_mask", "token_type_ids"))
            cache[network] = FamilyGolden(d, tensors, config, inputs, {k: g[v] for k, v in outputs.items()})
        return cache[network]

    return load
