r"""``python -m bert_jax.visualize``: a checkpoint's attention on one text as an HTML page (and a PNG).

    python -m bert_jax.visualize --init hf:pkg:minilm --text "The cat sat on the mat." \
        [--text_b "It was tired."] --output attn.html [--png attn.png] [--layer -1] [--head 1]

``--init`` takes what fine-tuning's ``init_checkpoint`` takes (hf:DIR, tf:PREFIX, orbax:DIR, a
pre-training workdir) or a fine-tuning workdir. ``--layer`` (1..L, or -1 = last) is where the
head view opens and which layer the PNG shows; ``--head`` (1..H) puts one head in the PNG instead
of all of them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from input_pipeline import command_line as cli
from input_pipeline.files import check_output_file, write_atomically


def parser() -> cli.ArgumentParser:
    p = cli.ArgumentParser(prog="python -m bert_jax.visualize", description=__doc__.split("\n")[0])
    p.add_argument("--init", required=True, help="checkpoint: hf:DIR, tf:PREFIX, orbax:DIR or a training workdir "
                                                 "(pkg: names resolved, e.g. hf:pkg:minilm)")
    p.add_argument("--text", required=True, help="the input text (segment A)")
    p.add_argument("--text_b", "--text-b", default=None, help="a second segment: the pair [CLS] a [SEP] b [SEP]")
    p.add_argument("--output", required=True, help="the HTML page to write (self-contained, works offline)")
    p.add_argument("--png", default=None, help="also write heat-maps of --layer to this PNG")
    p.add_argument("--layer", type=int, default=-1, help="layer 1..L (or -1 = last, -2, ...): the head "
                                                          "view's first layer and the PNG's layer")
    p.add_argument("--head", type=int, default=None, help="head 1..H: the PNG shows only this head")
    p.add_argument("--max_seq_length", "--max-seq-length", type=int, default=None,
                   help="longer inputs are truncated, and the page says so (default: 128, or less if the "
                        "checkpoint's position table is shorter)")
    p.add_argument("--vocab", default=None, help="vocabulary (default: the checkpoint's own)")
    return p


def layer_index(layer: int, num_layers: int) -> int:
    """--layer as given (1..L or -1..-L) → 0-based; ValueError naming the flag otherwise."""
    if 1 <= layer <= num_layers:
        return layer - 1
    if -num_layers <= layer <= -1:
        return layer % num_layers
    raise ValueError(f"--layer {layer}: expected 1..{num_layers} or -1..-{num_layers} for this {num_layers}-layer "
                     f"model")


def run(init: str, text: str, output, *, text_b: str | None = None, png=None, layer: int = -1,
        head: int | None = None, max_seq_length: int | None = None, vocab: str | None = None) -> dict:
    """The whole tool as a function (tests call it); returns a small summary."""
    from bert_jax.visualize import attention, html

    if not text.strip():
        raise ValueError("--text: expected a non-empty text")
    for path in (output, png):
        if path:
            check_output_file(path)
    if png:
        cli.require_extra("apps", "matplotlib", purpose="--png")
    model, tokenizer = attention.load(init, vocab)
    num_layers, num_heads = model.cfg.num_layers, model.cfg.num_heads
    start = layer_index(layer, num_layers)
    if head is not None and not 1 <= head <= num_heads:
        raise ValueError(f"--head {head}: expected 1..{num_heads} for this model")
    att = attention.attention_of(model, tokenizer, text, text_b, max_seq_length=max_seq_length)
    page = html.render(att, layer=start, title=f"Attention: {init}")
    image = None
    if png:
        from bert_jax.visualize.png import png_bytes

        image = png_bytes(att, layer=start, head=None if head is None else head - 1)
    write_atomically(Path(output), page.encode("utf-8"))
    if image is not None:
        write_atomically(Path(png), image)
    if att.truncated:
        print(f"note: the input had {att.total_tokens} tokens; truncated to {len(att.tokens)} "
              f"(--max_seq_length {len(att.tokens) if max_seq_length is None else max_seq_length})", file=sys.stderr)
    return {"tokens": len(att.tokens), "truncated": att.truncated, "layers": num_layers, "heads": num_heads,
            "output": str(output), "png": str(png) if png else None}


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    from input_pipeline import hide_accelerators_from_tf

    hide_accelerators_from_tf()
    summary = run(args.init, args.text, args.output, text_b=args.text_b, png=args.png, layer=args.layer,
                  head=args.head, max_seq_length=args.max_seq_length, vocab=args.vocab)
    print(json.dumps(summary))
