"""Bad input never gives a silent wrong answer: every cell of the "Bad input" table (docs/bad_input.md).

Each case feeds one bad input to one public entry point and expects a ValueError whose message
names the argument and the bad value or the limit. The README table is parsed: every cell that
promises an error has a case here, and every case here has its cell.

One tiny model per family is built once for the module; the errors are raised on the host before
any compiled step, so the cases cost milliseconds each.
"""

import re
from pathlib import Path

import numpy as np
import pytest

import keras_transformer as kt
from tests.models.seq2seq_helpers import digit_tokenizer

README = Path(__file__).resolve().parents[1] / "docs" / "bad_input.md"  # the table, moved out of the README

# README table labels -> case keys.
ROWS = {
    "token id ≥ vocabulary size": "too_large",
    "negative token id": "negative",
    "float token ids": "float",
    "sequence longer than the model's maximum": "too_long",
    "empty batch": "empty_batch",
    "empty string": "empty_string",
    "mask shape differs from the ids": "mask_shape",
    "wrong number of labels": "labels",
    "NaN or inf in `fit` / `evaluate` inputs": "nan",
}
COLUMNS = {
    "`backbone(x)`, numpy": "backbone",
    "task `fit` / `evaluate` / `predict`, id dicts": "task_ids",
    "task `fit` / `evaluate` / `predict`, strings": "task_text",
    "`generate`": "generate",
    "preprocessor `(x, y)`": "preprocessor",
    "tokenizer": "tokenizer",
}
NOT_AN_ERROR = "—"

MAX_LENGTH = 16
WORDS = ["apple", "river", "stone", "cloud", "green", "music", "paper", "light"]


# --- models: one per family, built once -----------------------------------------------------


@pytest.fixture(scope="module")
def models():
    rng = np.random.default_rng(0)
    texts = [" ".join(rng.choice(WORDS, 5)) for _ in range(50)]
    bpe = kt.tokenizers.BytePairTokenizer.train(texts, vocabulary_size=280)
    word_piece = kt.tokenizers.WordPieceTokenizer.from_vocabulary(
        ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS
    )
    digits = digit_tokenizer()
    small = dict(num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16, max_sequence_length=MAX_LENGTH)

    gpt = kt.models.GPTBackbone(vocabulary_size=bpe.vocabulary_size, **small)
    bert = kt.models.BertBackbone(vocabulary_size=word_piece.vocabulary_size, **small)
    t5 = kt.models.T5Backbone(vocabulary_size=digits.vocabulary_size, **small)
    transformer = kt.models.TransformerBackbone(vocabulary_size=digits.vocabulary_size, **small)
    # A GPT whose tokenizer has more ids (280) than its embedding (100): only the checks notice.
    narrow = kt.models.GPTBackbone(vocabulary_size=100, **small)
    tasks = {
        "gpt": kt.models.GPTCausalLM(gpt, kt.models.GPTCausalLMPreprocessor(bpe, sequence_length=12)),
        "bert_mlm": kt.models.BertMaskedLM(bert, kt.models.BertMaskedLMPreprocessor(word_piece, sequence_length=12)),
        "bert_classifier": kt.models.BertClassifier(
            bert, num_classes=3, preprocessor=kt.models.BertTextClassifierPreprocessor(word_piece, sequence_length=12)
        ),
        "t5": kt.models.T5Seq2SeqLM(t5, kt.models.T5Seq2SeqLMPreprocessor(digits, 8, 8)),
        "transformer": kt.models.TransformerSeq2SeqLM(
            transformer, kt.models.TransformerSeq2SeqLMPreprocessor(digits, 8, 8)
        ),
        "narrow_gpt": kt.models.GPTCausalLM(narrow, kt.models.GPTCausalLMPreprocessor(bpe, sequence_length=12)),
    }
    for task in tasks.values():
        task.compile(optimizer="sgd")  # plain SGD: cheap to create; no step ever runs here
    return {
        "backbones": {"gpt": gpt, "bert": bert, "t5": t5, "transformer": transformer},
        "tasks": tasks,
        "texts": texts,
    }


BACKBONES = ["gpt", "bert", "t5", "transformer"]
TASKS = ["gpt", "bert_mlm", "bert_classifier", "t5", "transformer"]
TASK_BACKBONE = {"gpt": "gpt", "bert_mlm": "bert", "bert_classifier": "bert", "t5": "t5", "transformer": "transformer"}


def good_inputs(family, batch=2, length=6):
    """Valid id inputs of a backbone family (and of its tasks): ids 1.., all-True masks."""
    ids = np.arange(1, batch * length + 1, dtype="int32").reshape(batch, length) % 5 + 1  # (B, T)
    mask = np.ones((batch, length), bool)
    if family in ("gpt", "bert"):
        x = {"token_ids": ids, "padding_mask": mask}
        if family == "bert":
            x["segment_ids"] = np.zeros((batch, length), "int32")
        return x
    return {
        "encoder_token_ids": ids,
        "encoder_padding_mask": mask,
        "decoder_token_ids": ids.copy(),
        "decoder_padding_mask": mask.copy(),
    }


def task_inputs(task_name, **kwargs):
    x = good_inputs(TASK_BACKBONE[task_name], **kwargs)
    if task_name == "bert_mlm":
        x["mask_positions"] = np.zeros((len(x["token_ids"]), 2), "int32")
    return x


def task_labels(task_name, batch=2, length=6):
    if task_name == "bert_classifier":
        return np.zeros((batch,), "int32")
    if task_name == "bert_mlm":
        return np.ones((batch, 2), "int32")
    return np.ones((batch, length), "int32")


def ids_key(family):
    return "token_ids" if family in ("gpt", "bert") else "encoder_token_ids"


def bad_ids(x, key, case, vocabulary_size):
    """Make `x[key]` bad in the way `case` says -> (x, expected message regex)."""
    x = {k: v.copy() for k, v in x.items()}
    name = re.escape(f"`{key}`")
    if case == "too_large":
        x[key][0, 5] = vocabulary_size + 3
        return (
            x,
            rf"{name} has id {vocabulary_size + 3} at \[0, 5\], outside \[0, {vocabulary_size}\) "
            rf"\(vocabulary_size={vocabulary_size}\)",
        )
    if case == "negative":
        x[key][1, 2] = -1
        return x, rf"{name} has id -1 at \[1, 2\], outside \[0, {vocabulary_size}\)"
    if case == "float":
        x[key] = x[key].astype("float32")
        return x, rf"{name} must hold integer ids. Received: dtype=float32"
    if case == "nan":
        x[key] = x[key].astype("float32")
        x[key][1, 3] = np.nan
        return x, rf"{name} has nan at \[1, 3\]"
    raise AssertionError(case)


def bad_shape(family_inputs, case, key):
    """Cases that change shapes: too long, empty batch, a mask of another shape."""
    if case == "too_long":
        return family_inputs(
            length=MAX_LENGTH + 1
        ), rf"has {MAX_LENGTH + 1} positions, more than max_sequence_length={MAX_LENGTH}"
    if case == "empty_batch":
        return family_inputs(batch=0), r"is an empty batch.*shape=\(0, 6\)"
    if case == "mask_shape":
        x = family_inputs()
        mask_key = key.replace("token_ids", "padding_mask")
        x[mask_key] = x[mask_key][:, :-1]
        return (
            x,
            rf"`{mask_key}` must have the shape of `{key}`. Received: {mask_key}.shape=\(2, 5\), {key}.shape=\(2, 6\)",
        )
    raise AssertionError(case)


ID_CASES = ["too_large", "negative", "float", "nan"]
SHAPE_CASES = ["too_long", "empty_batch", "mask_shape"]


# --- column: backbone(x) with numpy -------------------------------------------------------

BACKBONE_CASES = {"too_large", "negative", "float", "too_long", "empty_batch", "mask_shape", "nan"}


@pytest.mark.parametrize("case", ID_CASES + SHAPE_CASES)
@pytest.mark.parametrize("family", BACKBONES)
def test_backbone_call(models, family, case):
    backbone = models["backbones"][family]
    keys = ["token_ids"] if family in ("gpt", "bert") else ["encoder_token_ids", "decoder_token_ids"]
    for key in keys:  # seq2seq: both sides
        if case in ID_CASES:
            x, match = bad_ids(good_inputs(family), key, case, backbone.vocabulary_size)
        else:
            x, match = bad_shape(lambda **kw: good_inputs(family, **kw), case, key)
        with pytest.raises(ValueError, match=match):
            backbone(x)


def test_backbone_segment_ids_and_good_inputs_pass(models):
    backbone = models["backbones"]["bert"]
    x = good_inputs("bert")
    assert backbone(x)["sequence_output"].shape == (2, 6, 8)  # the checks let good inputs through
    x["segment_ids"][0, 1] = 2
    with pytest.raises(ValueError, match=r"`segment_ids` has id 2 at \[0, 1\], outside \[0, 2\) \(num_segments=2\)"):
        backbone(x)


# --- column: task fit / evaluate / predict with id dicts -------------------------------------

TASK_IDS_CASES = {"too_large", "negative", "float", "too_long", "empty_batch", "mask_shape", "labels", "nan"}


def _call(task, method, x, y=None, sample_weight=None):
    if method == "predict":
        return task.predict(x, verbose=0)
    return getattr(task, method)(x, y, sample_weight=sample_weight, verbose=0)


@pytest.mark.parametrize("method", ["fit", "evaluate", "predict"])
@pytest.mark.parametrize("case", ID_CASES + SHAPE_CASES)
@pytest.mark.parametrize("task_name", TASKS)
def test_task_id_inputs(models, task_name, case, method):
    task = models["tasks"][task_name]
    key = ids_key(TASK_BACKBONE[task_name])
    if case in ID_CASES:
        x, match = bad_ids(task_inputs(task_name), key, case, task.backbone.vocabulary_size)
    else:
        x, match = bad_shape(lambda **kw: task_inputs(task_name, **kw), case, key)
    y = task_labels(task_name, batch=len(x[key]), length=x[key].shape[1])
    with pytest.raises(ValueError, match=match):
        _call(task, method, x, y)


@pytest.mark.parametrize("method", ["fit", "evaluate"])
@pytest.mark.parametrize("task_name", TASKS)
def test_task_id_inputs_labels_and_nan(models, task_name, method):
    task = models["tasks"][task_name]
    x, y = task_inputs(task_name), task_labels(task_name)
    with pytest.raises(ValueError, match=r"`y` has 1 rows for 2 examples in `x`"):
        _call(task, method, x, y[:1])
    bad = y.astype("float32")
    bad.reshape(-1)[1] = np.nan
    where = "[1]" if bad.ndim == 1 else "[0, 1]"
    with pytest.raises(ValueError, match=rf"`y` has nan at {re.escape(where)}"):
        _call(task, method, x, bad)
    weights = np.ones(2, "float32")
    weights[1] = np.inf
    with pytest.raises(ValueError, match=r"`sample_weight` has inf at \[1\]"):
        _call(task, method, x, y, sample_weight=weights)
    label_limit = 3 if task_name == "bert_classifier" else task.backbone.vocabulary_size
    limit_name = "vocabulary_size"
    y = y.copy()
    y.reshape(-1)[-1] = label_limit
    match = rf"`y` has label {label_limit} .*outside \[0, {label_limit}\) \({limit_name}="
    if task_name == "bert_classifier":  # the classifier's own label check comes first
        match = r"Labels must be in \[0, num_classes\) with num_classes=3. Received: label 3"
    with pytest.raises(ValueError, match=match):
        _call(task, method, x, y)


def test_task_validation_data_and_mask_positions_are_checked(models):
    task = models["tasks"]["bert_mlm"]
    x, y = task_inputs("bert_mlm"), task_labels("bert_mlm")
    bad = dict(x, mask_positions=np.full((2, 2), 6, "int32"))
    with pytest.raises(ValueError, match=r"`mask_positions` has position 6 at \[0, 0\], outside \[0, 6\)"):
        task.predict(bad, verbose=0)
    with pytest.raises(ValueError, match=r"In `validation_data`: `mask_positions` has position 6"):
        task.fit(x, y, validation_data=(bad, y), verbose=0)


def test_task_call_with_numpy_is_checked(models):
    task = models["tasks"]["gpt"]
    x, match = bad_ids(task_inputs("gpt"), "token_ids", "too_large", task.backbone.vocabulary_size)
    with pytest.raises(ValueError, match=match):
        task(x)


# --- column: task fit / evaluate / predict with strings -------------------------------------

TEXT_CASES = {"too_large", "too_long", "empty_batch", "empty_string", "labels", "nan"}


def _text_batch(task_name, texts):
    """(x, y) of raw strings for a task: seq2seq pairs sources with themselves, the classifier gets labels."""
    if task_name in ("t5", "transformer"):
        digits = ["1 2 3"] * len(texts) if texts and texts[0] != "" else texts
        return (digits, list(digits)), None
    if task_name == "bert_classifier":
        return texts, np.zeros(len(texts), "int32")
    return texts, None


def _text_call(task, method, x, y=None, sample_weight=None):
    if method == "predict":
        return task.predict(x, verbose=0)
    return getattr(task, method)(x, y, sample_weight=sample_weight, verbose=0)


@pytest.mark.parametrize("method", ["fit", "evaluate", "predict"])
@pytest.mark.parametrize("case", ["too_long", "empty_batch", "empty_string"])
@pytest.mark.parametrize("task_name", TASKS)
def test_task_text_inputs(models, task_name, case, method):
    task = models["tasks"][task_name]
    if case == "too_long":
        texts = [" ".join(["apple"] * 20)] if task_name not in ("t5", "transformer") else None
        x, y = _text_batch(task_name, texts or ["x"])
        if texts is None:  # 20 digits: 21 tokens with </s>, for 8 positions
            x = ([" ".join(["1"] * 20)], ["1"])
        match = r"longer than `sequence_length`=\d+|more than the \d+ that fit in sequence_length=12"
    elif case == "empty_batch":
        x, y = ([], []) if task_name in ("t5", "transformer") else [], None
        if task_name == "bert_classifier":
            y = np.zeros((0,), "int32")
        match = r"`x` is an empty batch"
    else:
        x, y = _text_batch(task_name, ["apple river", ""])
        if task_name in ("t5", "transformer"):
            x = (["1 2", ""], ["1 2", "3"])
        match = r"`x` holds an empty string at index 1.*Received: x\[1\]=''"
    with pytest.raises(ValueError, match=match):
        _text_call(task, method, x, y)


@pytest.mark.parametrize("method", ["fit", "evaluate"])
def test_task_text_labels_and_nan(models, method):
    classifier, t5 = models["tasks"]["bert_classifier"], models["tasks"]["t5"]
    texts = ["apple river", "stone cloud", "green music", "paper light"]
    with pytest.raises(ValueError, match=r"Got 3 labels for 4 texts"):
        _text_call(classifier, method, texts, [0, 1, 2])
    with pytest.raises(ValueError, match=r"Received: 2 sources and 1 targets"):
        _text_call(t5, method, (["1 2", "3"], ["2 1"]))
    with pytest.raises(ValueError, match=r"`y` has nan at \[2\]"):
        _text_call(classifier, method, texts, [0, 1, np.nan, 2])
    with pytest.raises(ValueError, match=r"`sample_weight` has nan at \[0\]"):
        _text_call(t5, method, (["1 2", "3"], ["2 1", "3"]), sample_weight=[np.nan, 1.0])
    with pytest.raises(ValueError, match=r"`sample_weight` has nan at \[0\]"):
        _text_call(models["tasks"]["gpt"], method, ["apple", "river"], sample_weight=[np.nan, 1.0])


@pytest.mark.parametrize("method", ["fit", "evaluate", "predict"])
def test_task_text_tokenizer_larger_than_model(models, method):
    # The tokenizer's byte tokens have ids up to 279; the model embeds 100.
    task = models["tasks"]["narrow_gpt"]
    with pytest.raises(
        ValueError, match=r"`token_ids` has id \d+ at \[0, \d+\], outside \[0, 100\) \(vocabulary_size=100\)"
    ):
        _text_call(task, method, ["apple river"])


def test_task_text_dataset_batches_are_checked(models):
    import keras

    class Texts(keras.utils.PyDataset):
        def __len__(self):
            return 1

        def __getitem__(self, index):
            return ["apple river"]

    with pytest.raises(ValueError, match=r"`token_ids` has id \d+ .*\(vocabulary_size=100\)"):
        models["tasks"]["narrow_gpt"].fit(Texts(), verbose=0)


# --- column: generate -----------------------------------------------------------------------

GENERATE_CASES = {"too_large", "negative", "float", "too_long", "empty_batch", "empty_string"}
GENERATORS = ["gpt", "t5", "transformer"]


@pytest.mark.parametrize("case", sorted(GENERATE_CASES))
@pytest.mark.parametrize("task_name", GENERATORS)
def test_generate(models, task_name, case):
    task = models["tasks"][task_name]
    vocabulary_size = task.backbone.vocabulary_size
    inputs = np.array([[1, 2, 3], [4, 5, 1]], "int32")
    if case == "too_large":
        inputs[0, 1] = vocabulary_size
        match = rf"`inputs` holds token id {vocabulary_size}, outside \[0, vocabulary_size={vocabulary_size}\)"
    elif case == "negative":
        inputs[1, 0] = -2
        match = rf"`inputs` holds token id -2, outside \[0, vocabulary_size={vocabulary_size}\)"
    elif case == "float":
        inputs = inputs.astype("float64")
        match = r"`inputs` must hold integer token ids. Received: dtype=float64"
    elif case == "too_long":
        inputs = np.ones((1, MAX_LENGTH + 1), "int32")
        match = rf"longer than (the model's )?max_sequence_length={MAX_LENGTH}|max_sequence_length={MAX_LENGTH}"
    elif case == "empty_batch":
        inputs = []
        match = r"`inputs` is an empty batch"
    else:
        inputs = ["apple", ""] if task_name == "gpt" else ["1 2", ""]
        match = r"`(prompts|x)` holds an empty string at index 1"
    with pytest.raises(ValueError, match=match):
        task.generate(inputs, max_new_tokens=2)


# --- column: preprocessors --------------------------------------------------------------------

PREPROCESSOR_CASES = {"too_long", "empty_batch", "empty_string", "labels"}


@pytest.mark.parametrize("case", sorted(PREPROCESSOR_CASES))
@pytest.mark.parametrize("task_name", TASKS)
def test_preprocessor(models, task_name, case):
    preprocessor = models["tasks"][task_name].preprocessor
    seq2seq = task_name in ("t5", "transformer")
    if case == "too_long":
        args = (([" ".join(["1"] * 20)], ["1"]),) if seq2seq else ([" ".join(["apple"] * 20)],)
        match = r"longer than `sequence_length`=\d+|more than the \d+ that fit in sequence_length=12"
    elif case == "empty_batch":
        args = (([], []),) if seq2seq else ([],)
        match = r"`x` is an empty batch"
    elif case == "empty_string":
        args = ((["1", ""], ["1", "2"]),) if seq2seq else (["apple", ""],)
        match = r"`x` holds an empty string at index 1"
    else:
        if task_name == "bert_classifier":
            args, match = (["apple", "river"], [1]), r"Got 1 labels for 2 texts"
        elif seq2seq:
            args, match = ((["1", "2"], ["1"]),), r"Received: 2 sources and 1 targets"
        else:  # causal and masked LMs learn from the text itself: any label is refused
            args, match = (["apple", "river"], [1, 0]), r"learns from the text itself: pass only `x`"
    with pytest.raises(ValueError, match=match):
        preprocessor(*args)


def test_preprocessors_apply_sample_weights_and_check_their_count(models):
    for name, x in (("gpt", ["apple river", "stone"]), ("t5", (["1 2", "3"], ["2 1", "3"]))):
        preprocessor = models["tasks"][name].preprocessor
        _, _, plain = preprocessor(x)  # (B, T): 1 on real labels
        _, _, weighted = preprocessor(x, sample_weight=[2.0, 0.5])
        np.testing.assert_array_equal(weighted, plain * np.array([[2.0], [0.5]]))
        with pytest.raises(ValueError, match=r"`sample_weight` has 3 rows for 2 examples in `x`"):
            preprocessor(x, sample_weight=[1.0, 1.0, 1.0])


# --- column: tokenizer ------------------------------------------------------------------------

TOKENIZER_CASES = {"too_large", "negative", "float", "empty_string"}


@pytest.mark.parametrize("case", sorted(TOKENIZER_CASES))
@pytest.mark.parametrize("task_name", ["gpt", "bert_mlm", "t5"])
def test_tokenizer(models, task_name, case):
    tokenizer = models["tasks"][task_name].preprocessor.tokenizer
    size = tokenizer.vocabulary_size
    if case == "empty_string":  # not an error at this level: no text, no ids (preprocessors refuse it)
        assert tokenizer.tokenize("") == [] and tokenizer.tokenize(["a", ""])[1] == []
        return
    ids = {"too_large": [1, size], "negative": [1, -1], "float": np.array([1.0, 2.0])}[case]
    match = {
        "too_large": rf"`detokenize` got an id outside \[0, {size}\). Received: id {size}",
        "negative": rf"`detokenize` got an id outside \[0, {size}\). Received: id -1",
        "float": r"`detokenize` expects integer token ids. Received: a row of dtype float64",
    }[case]
    with pytest.raises(ValueError, match=match):
        tokenizer.detokenize(ids)


# --- the README table and the cases above describe the same thing -----------------------------

CASES = {
    "backbone": BACKBONE_CASES,
    "task_ids": TASK_IDS_CASES,
    "task_text": TEXT_CASES,
    "generate": GENERATE_CASES,
    "preprocessor": PREPROCESSOR_CASES,
    "tokenizer": TOKENIZER_CASES,
}


def readme_table():
    """The "Bad input" table -> {(row key, column key): cell text}."""
    text = README.read_text(encoding="utf-8")
    section = text.split("\n## Bad input\n", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    columns = [COLUMNS[name] for name in header[1:]]
    table = {}
    for line in lines[2:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        for column, cell in zip(columns, cells[1:]):
            table[ROWS[cells[0]], column] = cell
    return table


def test_readme_table_matches_the_cases():
    table = readme_table()
    assert {row for row, _ in table} == set(ROWS.values())
    documented = {key for key, cell in table.items() if cell != NOT_AN_ERROR}
    tested = {(row, column) for column, rows in CASES.items() for row in rows}
    assert documented == tested
