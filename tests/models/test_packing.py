"""Long documents train: `pack_documents` and `GPTCausalLMPreprocessor(packing=True)` against a plain-Python reference.

The reference below is the recipe written as loops: concatenate the documents, then walk the
stream T ids at a time; window k's inputs are stream[kT : kT+T] and its labels the next id of
each. Every id after the first is then a label exactly once.
"""

import keras
import numpy as np
import pytest

import keras_transformer as kt
from keras_transformer import presets
from keras_transformer.models.packing import pack_documents
from tests.models.seq2seq_helpers import DIGIT_VOCABULARY, digit_tokenizer


def reference_windows(documents, sequence_length, pad):
    """Lists of (inputs, labels, weights) rows, built one id at a time."""
    stream = []
    for document in documents:
        for token in document:
            stream.append(token)
    rows = []
    start = 0
    while start + 1 < len(stream):
        inputs, labels, weights, mask = [], [], [], []
        for offset in range(sequence_length):
            position = start + offset
            inputs.append(stream[position] if position < len(stream) else pad)
            mask.append(position < len(stream))
            has_label = position + 1 < len(stream)
            labels.append(stream[position + 1] if has_label else pad)
            weights.append(1.0 if has_label else 0.0)
        rows.append((inputs, mask, labels, weights))
        start += sequence_length
    return rows


def _as_rows(x, y, w):
    return [
        (list(ids), list(mask), list(labels), list(weights))
        for ids, mask, labels, weights in zip(
            x["token_ids"].tolist(), x["padding_mask"].tolist(), y.tolist(), w.tolist()
        )
    ]


@pytest.mark.parametrize("sequence_length", [1, 3, 4, 7, 50])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pack_documents_matches_the_reference(sequence_length, seed):
    rng = np.random.default_rng(seed)
    documents = [list(rng.integers(1, 99, rng.integers(0, 30))) for _ in range(rng.integers(1, 8))]
    x, y, w = pack_documents(documents, sequence_length, pad_token_id=0)
    assert _as_rows(x, y, w) == reference_windows(documents, sequence_length, 0)
    assert x["token_ids"].dtype == np.int32 and y.dtype == np.int32 and w.dtype == np.float32


def test_every_token_is_a_label_exactly_once():
    documents = [list(range(100, 100 + n)) for n in (5, 300, 1, 41)]  # distinct ids: each label names its token
    stream = [token for document in documents for token in document]
    for sequence_length in (8, 16, 128, 346, 1000):
        x, y, w = pack_documents(documents, sequence_length, pad_token_id=0)
        trained = sorted(y[w > 0].tolist())
        assert trained == sorted(stream[1:])  # every id after the first, once
        assert sorted(x["token_ids"][w > 0].tolist()) == sorted(stream[:-1])  # ...the id before it the input, once
        assert x["padding_mask"][w > 0].all()
        assert len(y) == -(-(len(stream) - 1) // sequence_length)


def test_pack_documents_weights_follow_their_document_and_bad_arguments_are_named():
    x, y, w = pack_documents([[1, 2, 3], [4, 5]], 2, document_weights=[2.0, 0.5])
    # labels 2, 3 (document 0), 4, 5 (document 1)
    assert y.tolist() == [[2, 3], [4, 5]] and w.tolist() == [[2.0, 2.0], [0.5, 0.5]]
    with pytest.raises(ValueError, match=r"`document_weights` needs one weight per document \(2\)"):
        pack_documents([[1, 2, 3], [4, 5]], 2, document_weights=[1.0])
    with pytest.raises(ValueError, match="sequence_length=0"):
        pack_documents([[1, 2]], 0)
    x, y, w = pack_documents([[7]], 4)  # one id: nothing to predict
    assert x["token_ids"].shape == (0, 4) and w.shape == (0, 4)


@pytest.fixture(scope="module")
def tokenizer():
    return kt.tokenizers.Tokenizer.load(presets.resolve("gpt_tiny"))


LONG_TEXTS = ["def f(x):\n    return x\n" * 30, "import os\n", "class A:\n    pass\n" * 12]


def test_preprocessor_packing_matches_the_reference_stream(tokenizer):
    preprocessor = kt.models.GPTCausalLMPreprocessor(tokenizer, sequence_length=16, packing=True)
    x, y, w = preprocessor(LONG_TEXTS)
    end = tokenizer.eos_token_id
    assert tokenizer.bos_token_id == end  # GPT-2 style: one <|endoftext|> between two documents
    stream = [end]
    for text in LONG_TEXTS:
        stream += tokenizer.tokenize(text) + [end]
    assert _as_rows(x, y, w) == reference_windows([stream], 16, tokenizer.pad_token_id)
    assert len(y) > len(LONG_TEXTS)  # the texts are longer than one window
    # Without packing the same texts are refused, and the error names both fixes.
    plain = kt.models.GPTCausalLMPreprocessor(tokenizer, sequence_length=16)
    with pytest.raises(ValueError, match=r"longer than `sequence_length`=16 .*packing=True.*truncate=True"):
        plain(LONG_TEXTS)


def test_preprocessor_packing_with_distinct_start_and_end_tokens():
    # Digits plus a start token "<s>": every document is framed as <s> ... </s>.
    vocabulary = DIGIT_VOCABULARY + [("<s>", 0.0)]
    backend = kt.tokenizers.UnigramTokenizer.from_vocabulary(vocabulary).backend_tokenizer
    tokenizer = kt.tokenizers.Tokenizer(backend, pad_token="<pad>", bos_token="<s>", eos_token="</s>")
    assert tokenizer.bos_token_id != tokenizer.eos_token_id
    preprocessor = kt.models.GPTCausalLMPreprocessor(tokenizer, sequence_length=3, packing=True)
    texts = ["1 2 3", "4 5"]
    x, y, w = preprocessor(texts)
    stream = []
    for text in texts:
        stream += [tokenizer.bos_token_id] + tokenizer.tokenize(text) + [tokenizer.eos_token_id]
    assert len(stream) == 9
    assert _as_rows(x, y, w) == reference_windows([stream], 3, tokenizer.pad_token_id)


def test_preprocessor_packing_options(tokenizer):
    preprocessor = kt.models.GPTCausalLMPreprocessor(tokenizer, sequence_length=16, packing=True)
    config = preprocessor.get_config()
    assert config["packing"] is True
    assert kt.models.GPTCausalLMPreprocessor.from_config(config, tokenizer=tokenizer).packing is True
    with pytest.raises(ValueError, match="Received: truncate=True, packing=True"):
        kt.models.GPTCausalLMPreprocessor(tokenizer, sequence_length=16, truncate=True, packing=True)
    # Per-text weights follow the text's tokens; per-token weights cannot.
    _, _, plain = preprocessor(LONG_TEXTS[:2])
    _, _, weighted = preprocessor(LONG_TEXTS[:2], sample_weight=[2.0, 0.0])
    assert set(np.unique(weighted[plain > 0]).tolist()) == {0.0, 2.0}
    assert weighted.sum() == 2.0 * (len(tokenizer.tokenize(LONG_TEXTS[0])) + 1)  # its tokens and its end token
    with pytest.raises(ValueError, match=r"one weight per text.*Received: shape=\(2, 16\)"):
        preprocessor(LONG_TEXTS[:2], sample_weight=np.ones((2, 16)))
    with pytest.raises(ValueError, match=r"`sample_weight` has 3 rows for 2 examples"):
        preprocessor(LONG_TEXTS[:2], sample_weight=[1.0, 1.0, 1.0])
    # predict keeps one row per text (and so refuses an over-long one).
    x, _, _ = preprocessor(["x = 1", "y = 2"], predict=True)
    assert x["token_ids"].shape == (2, 16)


def test_fit_and_evaluate_on_long_documents_with_packing(tokenizer):
    backbone = kt.models.GPTBackbone(
        vocabulary_size=tokenizer.vocabulary_size,
        num_layers=1,
        num_heads=2,
        hidden_dim=16,
        intermediate_dim=32,
        max_sequence_length=16,
    )
    preprocessor = kt.models.GPTCausalLMPreprocessor(tokenizer, sequence_length=16, packing=True)
    lm = kt.models.GPTCausalLM(backbone, preprocessor)
    lm.compile(optimizer=keras.optimizers.Adam(1e-2))
    x, _, w = preprocessor(LONG_TEXTS)
    before = lm.evaluate(LONG_TEXTS, verbose=0, return_dict=True)["loss"]
    history = lm.fit(LONG_TEXTS, batch_size=4, epochs=3, verbose=0).history
    assert len(history["loss"]) == 3
    after = lm.evaluate(LONG_TEXTS, verbose=0, return_dict=True)["loss"]
    assert np.isfinite(before) and after < before

    class Texts(keras.utils.PyDataset):  # batches of whole documents: each gives its own number of windows
        def __len__(self):
            return 2

        def __getitem__(self, index):
            return LONG_TEXTS[index : index + 2]

    assert np.isfinite(lm.fit(Texts(), epochs=1, verbose=0).history["loss"][0])


@pytest.mark.parametrize("family", ["t5", "bert_mlm", "bert_classifier"])
def test_other_preprocessors_refuse_long_inputs_and_name_truncate(family):
    if family == "t5":
        preprocessor = kt.models.T5Seq2SeqLMPreprocessor(digit_tokenizer(), 8, 8)
        inputs = ([" ".join(["1"] * 20)], ["1"])
    else:
        words = ["apple", "river"]
        tokenizer = kt.tokenizers.WordPieceTokenizer.from_vocabulary(
            ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words
        )
        cls = kt.models.BertMaskedLMPreprocessor if family == "bert_mlm" else kt.models.BertTextClassifierPreprocessor
        preprocessor = cls(tokenizer, sequence_length=8)
        inputs = [" ".join(["apple"] * 20)]
    with pytest.raises(ValueError, match=r"truncate=True") as error:
        preprocessor(inputs)
    assert "packing" not in str(error.value)  # packing is a causal LM's option only
    assert not hasattr(preprocessor, "packing")
