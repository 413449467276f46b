r"""Feature extraction: BERT's activations for each input text (the paper's feature-based use, §5.3).

    python -m bert_jax.interop.extract_features --init WORKDIR --input in.txt --output out.jsonl \
        [--layers -1,-2,-3,-4] [--max_seq_length 128] [--batch_size 32] [--vocab vocab.txt]

``--init``: a ``train.py`` workdir, pre-training or fine-tuning (its latest step; or
``WORKDIR/checkpoints/STEP``), ``hf:DIR``, ``tf:PREFIX`` or ``orbax:DIR``: every form
`bert_jax.interop.pretrained.read_checkpoint` takes. Its encoder runs; the vocabulary is the one
beside it (a workdir's ``config.json`` names it) unless ``--vocab`` is given.

Input: one text per line, or ``text_a ||| text_b`` pairs as Google's extract_features.py takes them.
Output ``*.jsonl``: the original tool's layout, one object per input line::

    {"linex_index": 0, "features": [{"token": "[CLS]", "layers": [{"index": -1, "values": [...]}]}]}

(``linex_index`` is the original's key, typo included, so existing readers work.) Output ``*.npz``:
``input_ids``, ``input_mask``, ``segment_ids`` int32 [N, L]; ``layer_<k>`` float32 [N, L, H] for
each requested k (0 = embedding output, -1 = last layer); ``pooled`` float32 [N, H] when the
checkpoint has a pooler. L is --max_seq_length if given, else the longest input.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
from absl import flags, logging

from input_pipeline.files import check_output_file


def read_inputs(path: str | Path) -> list[tuple[str, str | None]]:
    """Lines of ``path`` as (text_a, text_b or None); bad UTF-8 names the line."""
    out = []
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not valid UTF-8 ({e.reason} at byte {e.start})") from e
            a, sep, b = line.partition(" ||| ")
            out.append((a.strip(), b.strip() if sep else None))
    if not out:
        raise ValueError(f"{path}: no input lines")
    return out


def truncate_pair(a: list[int], b: list[int] | None, max_len: int, separators: int = 1) -> None:
    """In place, as the original: single inputs keep max_len - 2 tokens; a pair loses tokens from
    the end of its longer segment, one at a time, until it fits max_len - 2 - ``separators``
    (BERT's one [SEP] between the segments, RoBERTa's two)."""
    if b is None:
        del a[max(max_len - 2, 0):]
        return
    while len(a) + len(b) > max_len - 2 - separators:
        (a if len(a) > len(b) else b).pop()


def encode_inputs(tokenizer, inputs, max_seq_length: int | None, model_max: int):
    """→ (input_ids, input_mask, segment_ids) int32 [N, L] and per-input token strings, in the
    tokenizer's layout: ``cls a sep`` and ``cls a sep×pair_separators b sep`` with b in segment
    ``segment_b`` (BERT: [CLS] a [SEP] b [SEP], segment 1; RoBERTa: <s> a </s></s> b </s>, segment 0)."""
    import tensorflow as tf

    limit = max_seq_length or model_max
    texts = tf.constant([a for a, _ in inputs] + [b for _, b in inputs if b is not None])
    pieces = tokenizer.tokenize(texts).to_list() if len(inputs) else []
    it_b = iter(pieces[len(inputs):])
    rows = []
    for (_, b), a_ids in zip(inputs, pieces[: len(inputs)], strict=True):
        a_ids, b_ids = list(a_ids), (list(next(it_b)) if b is not None else None)
        truncate_pair(a_ids, b_ids, limit, tokenizer.pair_separators)
        ids = [tokenizer.cls_id, *a_ids, tokenizer.sep_id]
        seg = [0] * len(ids)
        if b_ids is not None:
            ids += [tokenizer.sep_id] * (tokenizer.pair_separators - 1) + [*b_ids, tokenizer.sep_id]
            seg += [tokenizer.segment_b] * (len(ids) - len(seg))
        rows.append((ids, seg))
    length = max_seq_length or max(len(ids) for ids, _ in rows)
    n = len(rows)
    input_ids = np.full((n, length), tokenizer.pad_id, np.int32)
    input_mask = np.zeros((n, length), np.int32)
    segment_ids = np.zeros((n, length), np.int32)
    for i, (ids, seg) in enumerate(rows):
        input_ids[i, : len(ids)], input_mask[i, : len(ids)], segment_ids[i, : len(seg)] = ids, 1, seg
    tokens = [tokenizer.id_to_token(ids) for ids, _ in rows]
    return input_ids, input_mask, segment_ids, tokens


def extract(model, arrays, layers: list[int], batch_size: int, *, progress: bool = True):
    """Runs the encoder in fixed-shape batches → ({k: [N, L, H]}, pooled [N, H] or None)."""
    import jax
    from flax import nnx
    from tqdm import tqdm

    input_ids, input_mask, segment_ids = arrays
    n, num_layers = len(input_ids), model.cfg.num_layers
    for k in layers:
        if not -(num_layers + 1) <= k <= num_layers:
            raise ValueError(f"--layers: {k} is out of range for a {num_layers}-layer model "
                             f"(0 = embeddings, 1..{num_layers}, or -1..-{num_layers + 1})")
    graphdef, state = nnx.split(model)

    @jax.jit
    def forward(state, ids, mask, seg):
        out = nnx.merge(graphdef, state)(ids, mask, seg, output_hidden_states=True)
        picked = [out.hidden_states[k] for k in layers]  # each [batch, length, embed]
        return picked, out.pooled_output

    feats = {k: [] for k in layers}
    pooled = []
    for start in tqdm(range(0, n, batch_size), desc="extract", unit="batch", disable=not progress,
                      file=sys.stderr):
        sl = slice(start, start + batch_size)
        pad = batch_size - len(input_ids[sl])  # pad the last batch: one compiled shape
        batch = [np.pad(a[sl], ((0, pad), (0, 0))) for a in (input_ids, input_mask, segment_ids)]
        picked, pool = forward(state, *batch)
        for k, v in zip(layers, picked, strict=True):
            feats[k].append(np.asarray(v, np.float32)[: batch_size - pad])
        if pool is not None:
            pooled.append(np.asarray(pool, np.float32)[: batch_size - pad])
    return {k: np.concatenate(v) for k, v in feats.items()}, (np.concatenate(pooled) if pooled else None)


def write_output(path: str | Path, arrays, feats, pooled, tokens) -> None:
    """Writes atomically (temporary file + rename): an interrupted run leaves no partial output."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            if path.suffix == ".npz":
                input_ids, input_mask, segment_ids = arrays
                out = dict(input_ids=input_ids, input_mask=input_mask, segment_ids=segment_ids)
                out.update({f"layer_{k}": v for k, v in feats.items()})
                if pooled is not None:
                    out["pooled"] = pooled
                np.savez(f, **out)
            else:
                for i, toks in enumerate(tokens):
                    features = [
                        {"token": tok, "layers": [
                            {"index": k, "values": [round(float(x), 6) for x in v[i, j]]}
                            for k, v in feats.items()]}
                        for j, tok in enumerate(toks)
                    ]
                    f.write(json.dumps({"linex_index": i, "features": features}).encode() + b"\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def run(init: str, input_path, output_path, *, layers=(-1, -2, -3, -4), max_seq_length=None,
        batch_size=32, vocab=None, progress=True) -> dict:
    """The whole tool as a function (tests call this); returns a small summary."""
    inputs = read_inputs(input_path)  # before the checkpoint and the imports: a bad input fails fast
    check_output_file(output_path)
    if batch_size < 1:
        raise ValueError(f"--batch_size {batch_size}: expected at least 1")
    from bert_jax.interop import pretrained
    from input_pipeline.tokenizers.factory import load_tokenizer

    ckpt = pretrained.read_checkpoint(init)
    vocab = vocab or ckpt.vocab_file
    if vocab is None:
        raise ValueError(f"{init}: no vocabulary beside the checkpoint (vocab.txt, RoBERTa's vocab.json + "
                         f"merges.txt, ModernBERT's tokenizer.json; a workdir's config.json names none); pass --vocab")
    tokenizer = load_tokenizer(vocab)  # WordPiece, SentencePiece or a byte-level BPE
    pretrained.check_vocab_size(ckpt.config, tokenizer.vocab_size, vocab, "the checkpoint")
    model_max = ckpt.config.max_position_embeddings - ckpt.config.position_offset  # longest row it takes
    if max_seq_length is not None and not 3 <= max_seq_length <= model_max:
        raise ValueError(f"--max_seq_length {max_seq_length}: expected 3..{model_max} for this checkpoint")
    model = pretrained.build_model(ckpt, with_heads=False, config=ckpt.config.deterministic())
    *arrays, tokens = encode_inputs(tokenizer, inputs, max_seq_length, model_max)
    feats, pooled = extract(model, arrays, list(layers), batch_size, progress=progress)
    write_output(output_path, arrays, feats, pooled, tokens)
    return {"inputs": len(inputs), "length": arrays[0].shape[1], "layers": list(layers),
            "output": str(output_path)}


def define_flags(fv: flags.FlagValues = flags.FLAGS) -> None:
    """Defines the command-line flags on `fv` (only when run as a program: no import-time flags)."""
    kw = {"flag_values": fv}
    flags.DEFINE_string("init", None, "checkpoint: a train.py workdir (its latest step, or WORKDIR/checkpoints/STEP), "
                        "hf:DIR, tf:PREFIX or orbax:DIR (pkg: names resolved, e.g. hf:pkg:minilm)", required=True,
                        **kw)
    flags.DEFINE_string("input", None, "text file: one input per line, or 'a ||| b' pairs", required=True, **kw)
    flags.DEFINE_string("output", None, "output file: *.jsonl (original layout) or *.npz", required=True, **kw)
    flags.DEFINE_list("layers", ["-1", "-2", "-3", "-4"], "layers to output; 0 = embeddings, -1 = last", **kw)
    flags.DEFINE_integer("max_seq_length", None, "truncate/pad to this length (default: longest input)", **kw)
    flags.DEFINE_integer("batch_size", 32, "inputs per forward pass", **kw)
    flags.DEFINE_string("vocab", None, "vocab.txt (default: the one beside the checkpoint)", **kw)


def main(argv, fv: flags.FlagValues = flags.FLAGS):
    if len(argv) > 1:
        raise ValueError(f"unexpected arguments: {argv[1:]} (flags are --name=value)")
    from input_pipeline import hide_accelerators_from_tf

    try:
        layers = [int(k) for k in fv.layers]
    except ValueError as e:
        raise ValueError(f"--layers {','.join(fv.layers)}: expected comma-separated integers") from e
    hide_accelerators_from_tf()
    summary = run(fv.init, fv.input, fv.output, layers=layers,
                  max_seq_length=fv.max_seq_length, batch_size=fv.batch_size, vocab=fv.vocab)
    logging.info("wrote %s", summary)
    print(json.dumps(summary))


if __name__ == "__main__":
    from input_pipeline import command_line as cli

    define_flags()
    cli.run_absl(main)
