"""The rule-based sentence splitter (input_pipeline/corpora/sentences.py)."""

import pytest

from input_pipeline.corpora.sentences import split_sentences


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Mr. Smith went to Washington. He arrived at 3.30 p.m. on Monday.",
         ["Mr. Smith went to Washington.", "He arrived at 3.30 p.m. on Monday."]),
        ("J. R. R. Tolkien wrote books. They sold well.",
         ["J. R. R. Tolkien wrote books.", "They sold well."]),
        ("Pi is approx. 3.14159. Really? Yes! See e.g. Euler. Dr. Who, i.e. The Doctor.",
         ["Pi is approx. 3.14159.", "Really?", "Yes!", "See e.g. Euler.",
          "Dr. Who, i.e. The Doctor."]),
        ('"Stop." She left. (It was late.) Then she slept... The end',
         ['"Stop."', "She left.", "(It was late.)", "Then she slept...", "The end"]),
        ("See No. 5 and pp. 12-14. He said no. Then left. Born in Jan. 1990 or so.",
         ["See No. 5 and pp. 12-14.", "He said no.", "Then left.", "Born in Jan. 1990 or so."]),
        ("The U.S. Army won in 1990. 25 saw it at www.example.com. Smith et al. (2005) agree.",
         ["The U.S. Army won in 1990.", "25 saw it at www.example.com.",
          "Smith et al. (2005) agree."]),
        ("lowercase after a period. is no boundary", ["lowercase after a period. is no boundary"]),
        ("Line one\nLine two. Line three.\n\n", ["Line one", "Line two.", "Line three."]),
        ("日本語の文です。二つ目の文！三つ目？", ["日本語の文です。", "二つ目の文！", "三つ目？"]),
        ("   ", []),
    ],
)
def test_split_sentences(text, expected):
    assert split_sentences(text) == expected
