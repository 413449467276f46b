"""The attention page: one self-contained HTML file (data as inline JSON, inline CSS and JS; no network).

Two views, drawn on canvases by the page's script:

* head view: the tokens twice, queries on the left and keys on the right; for the chosen layer and
  heads a line from each query to each key with the attention weight as its opacity, one colour
  per head; hovering a token shows only its lines.
* model view: a grid of thumbnails, a row per layer and a column per head, each the same drawing
  for one head; clicking a thumbnail shows that layer and head in the head view.

When drawn, the page records on ``<body>`` what it drew (``data-thumbnails``: thumbnails drawn,
``data-thumbnails-inked``: those with any pixel coloured, ``data-lines``: lines in the head view),
so a headless browser's ``--dump-dom`` can check it.
"""

from __future__ import annotations

import html
import json

from bert_jax.visualize.attention import Attention

DIGITS = 4  # decimals kept per probability in the page


def page_data(att: Attention, *, layer: int, title: str) -> dict:
    """What the page's script reads: tokens, segments, probs [layer][head][query][key], the start layer."""
    return {"title": title, "tokens": att.tokens, "segments": att.segment_ids, "layers": att.num_layers,
            "heads": att.num_heads, "layer": layer, "truncated": att.truncated, "total_tokens": att.total_tokens,
            "attention": att.probs.astype("float64").round(DIGITS).tolist()}


def render(att: Attention, *, layer: int = -1, title: str = "Attention") -> str:
    """The page for ``att``, opening the head view at ``layer`` (0-based; negative from the end)."""
    if not -att.num_layers <= layer < att.num_layers:
        raise ValueError(f"layer {layer}: expected 0..{att.num_layers - 1} or -1..-{att.num_layers}")
    data = json.dumps(page_data(att, layer=layer % att.num_layers, title=title), separators=(",", ":"))
    data = data.replace("<", "\\u003c")  # no "</script>" inside the script element
    note = (f"<p class=note>The input had {att.total_tokens} tokens; it was truncated to {len(att.tokens)}.</p>"
            if att.truncated else "")
    return (_PAGE.replace("__TITLE__", html.escape(title)).replace("__NOTE__", note)
            .replace("__CSS__", _CSS).replace("__JS__", _JS).replace("__DATA__", data))


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>__TITLE__</title>
<style>__CSS__</style></head>
<body>
<h1>__TITLE__</h1>
<p id="text"></p>
__NOTE__
<section><h2>Head view</h2>
<div class="controls"><label>Layer <select id="layer"></select></label>
<span id="heads"></span> <button id="all">all heads</button> <button id="none">none</button></div>
<canvas id="head-view"></canvas></section>
<section><h2>Model view <small>(rows: layers, columns: heads; click one to open it above)</small></h2>
<div id="model-view"></div></section>
<script id="data" type="application/json">__DATA__</script>
<script>__JS__</script>
</body></html>
"""

_CSS = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; background: #fff; }
h1 { font-size: 1.3em; } h2 { font-size: 1.1em; margin-top: 1.5em; } small { font-weight: normal; color: #666; }
.note { color: #a40; } #text { color: #444; }
.controls { margin: .5em 0; } .controls label { margin-right: 1em; }
.head { display: inline-block; width: 1.6em; text-align: center; margin: 1px; cursor: pointer;
        border: 2px solid transparent; border-radius: 3px; color: #fff; font-size: 12px; }
.head.off { opacity: .25; }
#model-view { display: grid; gap: 3px; align-items: center; }
#model-view canvas { border: 1px solid #ddd; cursor: pointer; }
#model-view span { font-size: 11px; color: #666; text-align: center; }
"""

_JS = r"""
"use strict";
const D = JSON.parse(document.getElementById("data").textContent);
const n = D.tokens.length, ROW = 20, WIDTH = 560, TEXT = 170;
let layer = D.layer, selected = new Set([...Array(D.heads).keys()]), hover = null;
const colour = (h, a) => `hsla(${Math.round(360 * h / D.heads)}, 75%, 45%, ${a})`;
document.getElementById("text").textContent = D.tokens.join(" ");

const layerSelect = document.getElementById("layer");
for (let l = 0; l < D.layers; l++) layerSelect.add(new Option(String(l + 1), String(l)));
layerSelect.value = String(layer);
layerSelect.onchange = () => { layer = Number(layerSelect.value); drawHeadView(); };

const headBoxes = [];
for (let h = 0; h < D.heads; h++) {
  const box = document.createElement("span");
  box.className = "head"; box.textContent = String(h + 1); box.style.background = colour(h, 1);
  box.title = `head ${h + 1}`;
  box.onclick = () => { selected.has(h) ? selected.delete(h) : selected.add(h); drawHeadView(); };
  document.getElementById("heads").appendChild(box); headBoxes.push(box);
}
document.getElementById("all").onclick = () => { selected = new Set([...Array(D.heads).keys()]); drawHeadView(); };
document.getElementById("none").onclick = () => { selected = new Set(); drawHeadView(); };

// Lines from query i (left, x0) to key j (right, x1) of one head, opacity = weight.
function drawLines(ctx, probs, h, x0, x1, y0, row, only, scale) {
  let count = 0;
  for (let i = 0; i < n; i++) {
    if (only !== null && only !== i) continue;
    for (let j = 0; j < n; j++) {
      const w = probs[i][j];
      if (w < 0.01) continue;
      ctx.strokeStyle = colour(h, Math.min(1, w * scale));
      ctx.beginPath(); ctx.moveTo(x0, y0 + (i + .5) * row); ctx.lineTo(x1, y0 + (j + .5) * row); ctx.stroke();
      count++;
    }
  }
  return count;
}

const canvas = document.getElementById("head-view");
canvas.width = WIDTH; canvas.height = n * ROW + 10;
function drawHeadView() {
  const ctx = canvas.getContext("2d");
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  ctx.font = "13px system-ui, sans-serif"; ctx.textBaseline = "middle";
  for (let i = 0; i < n; i++) {
    const weight = (hover === i) ? "bold " : "";
    ctx.font = weight + "13px system-ui, sans-serif";
    ctx.fillStyle = D.segments[i] ? "#246" : "#222";
    ctx.textAlign = "right"; ctx.fillText(D.tokens[i], TEXT - 8, 5 + (i + .5) * ROW);
    ctx.textAlign = "left"; ctx.fillText(D.tokens[i], WIDTH - TEXT + 8, 5 + (i + .5) * ROW);
  }
  ctx.lineWidth = 2;
  let lines = 0;
  for (const h of selected) lines += drawLines(ctx, D.attention[layer][h], h, TEXT, WIDTH - TEXT, 5, ROW, hover, 1);
  headBoxes.forEach((b, h) => b.classList.toggle("off", !selected.has(h)));
  document.body.dataset.lines = String(lines);
}
canvas.onmousemove = (e) => {
  const r = canvas.getBoundingClientRect(), i = Math.floor((e.clientY - r.top - 5) / ROW);
  const next = (i >= 0 && i < n) ? i : null;
  if (next !== hover) { hover = next; drawHeadView(); }
};
canvas.onmouseleave = () => { hover = null; drawHeadView(); };

function drawModelView() {
  const grid = document.getElementById("model-view"), size = 84;
  grid.style.gridTemplateColumns = `3.5em repeat(${D.heads}, ${size + 2}px)`;
  grid.appendChild(document.createElement("span"));
  for (let h = 0; h < D.heads; h++) {
    const s = document.createElement("span"); s.textContent = `head ${h + 1}`; grid.appendChild(s);
  }
  let drawn = 0, inked = 0;
  for (let l = 0; l < D.layers; l++) {
    const label = document.createElement("span"); label.textContent = `layer ${l + 1}`; grid.appendChild(label);
    for (let h = 0; h < D.heads; h++) {
      const c = document.createElement("canvas");
      c.width = size; c.height = size; c.className = "thumb"; c.title = `layer ${l + 1}, head ${h + 1}`;
      c.dataset.layer = String(l); c.dataset.head = String(h);
      const ctx = c.getContext("2d");
      ctx.lineWidth = 1;
      drawLines(ctx, D.attention[l][h], h, 12, size - 12, 2, (size - 4) / n, null, 1.5);
      const px = ctx.getImageData(0, 0, size, size).data;
      let any = false;
      for (let k = 3; k < px.length; k += 4) if (px[k] > 0) { any = true; break; }
      drawn++; if (any) inked++;
      c.onclick = () => {
        layer = l; layerSelect.value = String(l); selected = new Set([h]); drawHeadView();
        canvas.scrollIntoView({behavior: "smooth"});
      };
      grid.appendChild(c);
    }
  }
  document.body.dataset.thumbnails = String(drawn);
  document.body.dataset.thumbnailsInked = String(inked);
}
drawHeadView();
drawModelView();
"""


def attention_page(model, tokenizer, text: str, text_b: str | None = None, *, max_seq_length: int | None = None,
                   layer: int = -1, title: str | None = None) -> str:
    """The whole page for one input: what the server returns for ``GET /v1/attention``.

    ``model``: a `BertEncoder` or a model with one as ``.bert`` (a fine-tuned classifier), or a
    checkpoint spec (then ``tokenizer`` may be None: the checkpoint's own is used; see
    `bert_jax.visualize.attention.load`). Inputs longer than ``max_seq_length`` tokens are
    truncated and the page says so. ``layer``: where the head view opens (0-based, -1 = last).
    """
    from bert_jax.visualize.attention import attention_of, load

    if isinstance(model, str):
        model, own = load(model)
        tokenizer = tokenizer or own
    att = attention_of(model, tokenizer, text, text_b, max_seq_length=max_seq_length)
    return render(att, layer=layer, title=title or "Attention")
