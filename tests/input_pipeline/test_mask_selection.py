"""Which tokens masking picks (input_pipeline/pretraining/mask_selection.py), on hand-made rows whose answer is known.
The statistics and Google's greedy whole-word loop through `mask_example` are in test_masking.py."""

import numpy as np
import tensorflow as tf

from input_pipeline.pretraining.mask_selection import select_tokens, select_whole_words

F, T = False, True


def test_select_tokens_takes_the_n_best_candidates():
    cand = tf.constant([[F, T, T, T, T, F], [F, T, F, T, F, F]])
    score = tf.constant([[0, 5, 9, 1, 7, 0], [9, 1, 9, 2, 9, 9]])  # non-candidates' scores never count
    got = select_tokens(cand, score, tf.constant([2, 3]), num_slots=4).numpy()
    np.testing.assert_array_equal(got, [[F, F, T, F, T, F],  # the two highest: 9 and 7
                                        [F, T, F, T, F, F]])  # n=3 but only two candidates


def test_select_whole_words_skips_a_word_over_the_budget():
    # [CLS] a ##b c d ##e ##f [SEP]: words {1, 2}, {3}, {4, 5, 6}, scored by their first token: 5, 1, 9.
    cand = tf.constant([[F, T, T, T, T, T, T, F]] * 4)
    cont = [F, F, T, F, F, T, T, F]
    cont = tf.constant([cont] * 3 + [[F, T] + cont[2:]])  # last row: a continuation right after [CLS]
    score = tf.constant([[0, 5, 100, 1, 9, 100, 100, 0]] * 4)
    got = select_whole_words(cand, cont, score, tf.constant([3, 2, 1, 2])).numpy()
    np.testing.assert_array_equal(got, [
        [F, F, F, F, T, T, T, F],  # budget 3: the best word, 3 tokens
        [F, T, T, F, F, F, F, F],  # budget 2: the best word is too long and skipped; the next fits
        [F, F, F, T, F, F, F, F],  # budget 1: only the one-token word fits
        [F, T, T, F, F, F, F, F],  # "a" still starts a word: nothing before it to continue
    ])
