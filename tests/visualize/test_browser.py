"""The attention page as a person sees it: headless Chromium (Debian's ``chromium``) renders the real
MiniLM checkpoint's page; the screenshot is not blank and every layer x head thumbnail is drawn."""

import re
import shutil
import subprocess

import numpy as np
import pytest

from bert_jax.visualize import command

pytestmark = pytest.mark.slow
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def chromium(tmp_path, *args) -> subprocess.CompletedProcess:
    if CHROMIUM is None:
        pytest.skip("no headless browser: install Debian's chromium package (apt-get install chromium)")
    command_line = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--user-data-dir={tmp_path / 'profile'}", *args]
    result = subprocess.run(command_line, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return result


def test_chromium_draws_every_head(minilm_dir, tmp_path):
    from matplotlib.image import imread

    page = tmp_path / "attention.html"
    summary = command.run(f"hf:{minilm_dir}", "The cat sat on the mat because it was tired.", page)
    layers, heads = summary["layers"], summary["heads"]
    assert (layers, heads) == (6, 12)

    dom = chromium(tmp_path, "--dump-dom", page.as_uri()).stdout
    (body,) = re.findall(r"<body([^>]*)>", dom)
    drawn = dict(re.findall(r'data-([\w-]+)="(\d+)"', body))
    assert int(drawn["thumbnails"]) == layers * heads, body
    assert int(drawn["thumbnails-inked"]) == layers * heads, body  # every thumbnail has coloured pixels
    assert int(drawn["lines"]) >= summary["tokens"] * heads, body  # each query's strongest key, per head
    assert len(re.findall(r'<canvas[^>]* class="thumb"', dom)) == layers * heads

    shot = tmp_path / "shot.png"
    chromium(tmp_path, f"--screenshot={shot}", "--window-size=1200,1100", page.as_uri())
    pixels = imread(shot)[..., :3]  # [height, width, 3] in 0..1
    assert pixels.shape[:2] == (1100, 1200)
    coloured = np.abs(pixels - 1.0).max(-1) > 0.1  # not white
    assert pixels.std() > 0.05 and coloured.mean() > 0.05, (pixels.std(), coloured.mean())
    saturated = (pixels.max(-1) - pixels.min(-1)) > 0.3  # the heads' colours, not just black text
    assert saturated.mean() > 0.01, saturated.mean()
