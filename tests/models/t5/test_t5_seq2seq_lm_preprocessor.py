"""T5Seq2SeqLMPreprocessor: packing worked out by hand on a hand-written digit vocabulary.

Vocabulary (tests/models/seq2seq_helpers.py): <pad>=0, </s>=1, <unk>=2, "▁0".."▁9" = 3..12, so
the digit d has id d + 3 and "1 2 3" tokenizes to [4, 5, 6].
"""

import numpy as np
import pytest

from keras_transformer.models import T5Seq2SeqLMPreprocessor
from keras_transformer.models.preprocessor import Preprocessor
from keras_transformer.tokenizers import UnigramTokenizer
from tests.models import seq2seq_helpers as helpers


def _preprocessor(**kwargs):
    return T5Seq2SeqLMPreprocessor(
        helpers.digit_tokenizer(), **{"encoder_sequence_length": 5, "decoder_sequence_length": 4, **kwargs}
    )


def test_packing_by_hand():
    x, labels, weights = _preprocessor()((["1 2 3", "9"], ["4 5", "0 0 7"]))
    np.testing.assert_array_equal(x["encoder_token_ids"], [[4, 5, 6, 1, 0], [12, 1, 0, 0, 0]])
    np.testing.assert_array_equal(x["encoder_padding_mask"], [[1, 1, 1, 1, 0], [1, 1, 0, 0, 0]])
    # decoder input: the start token (= <pad>, id 0) then the target; a real position despite id 0.
    np.testing.assert_array_equal(x["decoder_token_ids"], [[0, 7, 8, 0], [0, 3, 3, 10]])
    np.testing.assert_array_equal(x["decoder_padding_mask"], [[1, 1, 1, 0], [1, 1, 1, 1]])
    np.testing.assert_array_equal(labels, [[7, 8, 1, 0], [3, 3, 10, 1]])
    np.testing.assert_array_equal(weights, [[1, 1, 1, 0], [1, 1, 1, 1]])
    assert x["encoder_token_ids"].dtype == np.int32 and x["decoder_padding_mask"].dtype == bool
    assert weights.dtype == np.float32 and labels.dtype == np.int32


def test_pair_and_x_y_forms_agree():
    preprocessor = _preprocessor()
    sources, targets = ["1 2", "3"], ["2 1", "3"]
    a = preprocessor((sources, targets))
    b = preprocessor(sources, targets)
    c = preprocessor(np.array(sources), np.array(targets))
    for other in (b, c):
        for key in a[0]:
            np.testing.assert_array_equal(a[0][key], other[0][key])
        np.testing.assert_array_equal(a[1], other[1])
        np.testing.assert_array_equal(a[2], other[2])


def test_sample_weight_multiplies_the_label_mask():
    _, _, weights = _preprocessor()((["1", "2"], ["3", "4 5"]), sample_weight=[2.0, 0.5])
    np.testing.assert_array_equal(weights, [[2, 2, 0, 0], [0.5, 0.5, 0.5, 0]])


def test_predict_needs_no_targets():
    x, labels, weights = _preprocessor()(["1 2"], predict=True)
    assert labels is None and weights is None
    np.testing.assert_array_equal(x["decoder_token_ids"], [[0, 0, 0, 0]])
    np.testing.assert_array_equal(x["decoder_padding_mask"], [[1, 0, 0, 0]])


def test_too_long_is_an_error_unless_truncate():
    with pytest.raises(ValueError, match="sequence_length"):
        _preprocessor()((["1 2 3 4 5"], ["1"]))  # 5 digits + </s> > 5
    with pytest.raises(ValueError, match="sequence_length"):
        _preprocessor()((["1"], ["1 2 3 4"]))  # start + 4 digits > 4
    x, labels, _ = _preprocessor(truncate=True)((["1 2 3 4 5"], ["1 2 3 4"]))
    np.testing.assert_array_equal(x["encoder_token_ids"], [[4, 5, 6, 7, 1]])  # the </s> is kept
    np.testing.assert_array_equal(x["decoder_token_ids"], [[0, 4, 5, 6]])
    np.testing.assert_array_equal(labels, [[4, 5, 6, 1]])


def test_missing_targets_and_mismatched_batches():
    with pytest.raises(ValueError, match="pairs"):
        _preprocessor()(["1 2"])
    with pytest.raises(ValueError, match="one to one"):
        _preprocessor()((["1", "2"], ["1"]))


def test_invalid_arguments():
    with pytest.raises(ValueError, match="decoder_sequence_length"):
        _preprocessor(decoder_sequence_length=1)
    with pytest.raises(ValueError, match="sequence_length"):
        _preprocessor(encoder_sequence_length=0)
    no_eos = UnigramTokenizer(helpers.digit_tokenizer().backend_tokenizer, eos_token=None)
    with pytest.raises(ValueError, match="eos_token"):
        T5Seq2SeqLMPreprocessor(no_eos)


def test_generate_pre_and_postprocess():
    preprocessor = _preprocessor()
    ids, mask = preprocessor.generate_preprocess(["3 1", "4"])
    np.testing.assert_array_equal(ids, [[6, 4, 1, 0, 0], [7, 1, 0, 0, 0]])
    np.testing.assert_array_equal(mask, [[1, 1, 1, 0, 0], [1, 1, 0, 0, 0]])
    assert preprocessor.decoder_start_token_id == 0 and preprocessor.tokenizer.eos_token_id == 1
    # Rows as a generator writes them: start token, digits, </s>, then anything.
    rows = np.array([[0, 6, 4, 1, 9, 9], [0, 12, 3, 3, 3, 3]])
    assert preprocessor.generate_postprocess(rows) == ["3 1", "9 0 0 0 0"]


def test_config_round_trip():
    preprocessor = _preprocessor(truncate=True)
    config = preprocessor.get_config()
    assert config == {"encoder_sequence_length": 5, "decoder_sequence_length": 4, "truncate": True}
    rebuilt = T5Seq2SeqLMPreprocessor.from_config(config, tokenizer=preprocessor.tokenizer)
    assert rebuilt.get_config() == config and isinstance(rebuilt, Preprocessor)


def test_docstring_example():
    from keras_transformer.models.t5 import t5_seq2seq_lm_preprocessor

    helpers.run_doctests(t5_seq2seq_lm_preprocessor)
