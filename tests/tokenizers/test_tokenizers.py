"""Tests for keras_transformer.tokenizers.

Expectations come from outside the code under test: ids worked out by hand on small hand-written
vocabularies, the round-trip rules each class documents (written here as plain Python), GPT-2's
byte table, and Hugging Face `transformers`, which builds its own BERT/GPT-2/T5 pipelines from
the same vocabularies. The training corpus is the source of two stdlib modules, so nothing is
downloaded.
"""

import doctest
import inspect
import json
import os
import re
import string
import subprocess
import sys
import textwrap
import unicodedata

import numpy as np
import pytest

from keras_transformer.tokenizers import BytePairTokenizer, Tokenizer, UnigramTokenizer, WordPieceTokenizer
from keras_transformer.tokenizers import byte_pair_tokenizer as byte_pair_module
from keras_transformer.tokenizers import tokenizer as tokenizer_module
from keras_transformer.tokenizers import unigram_tokenizer as unigram_module
from keras_transformer.tokenizers import word_piece_tokenizer as word_piece_module

VOCABULARY_SIZE = 500
CLASSES = (WordPieceTokenizer, BytePairTokenizer, UnigramTokenizer)
# Text none of the tokenizers saw in training: emoji, accents, tabs, runs of spaces, newlines.
NOVEL_TEXT = "Héllo  wörld 🤖\n\tdef f(x):\n        return x ** 2  # ½ done\n\n"


@pytest.fixture(scope="module")
def corpus():
    """About 30 KB of text: the source lines of two stdlib modules (code, comments, docstrings)."""
    lines = []
    for module in (textwrap, string):
        lines += inspect.getsource(module).splitlines(keepends=True)
    return lines


@pytest.fixture(scope="module")
def trained(corpus):
    """One tokenizer of each kind trained on the corpus, keyed by class."""
    return {cls: cls.train(corpus, VOCABULARY_SIZE) for cls in CLASSES}


def _gpt2_byte_table():
    """GPT-2's byte -> printable character table, as published with GPT-2 (encoder.py)."""
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    table = {byte: chr(byte) for byte in printable}
    extra = 0
    for byte in range(256):
        if byte not in table:
            table[byte] = chr(256 + extra)
            extra += 1
    return table


def _bert_detokenized(text):
    """What BERT's uncased round trip gives for ASCII text: lowercased words and punctuation
    marks (every ASCII symbol is one), separated by single spaces."""
    return " ".join(re.findall(r"[a-z0-9]+|[^a-z0-9\s]", text.lower()))


# === Ids on hand-written vocabularies (worked out by hand) ===


def test_word_piece_ids_on_a_hand_written_vocabulary():
    vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "quick", "brown",
                  "##ish", "fox", ",", ".", "hello", "jump", "##s"]  # fmt: skip
    tokenizer = WordPieceTokenizer.from_vocabulary(vocabulary)
    # the quick , brown ##ish fox jump ##s .
    assert tokenizer.tokenize("The QUICK, brownish fox jumps.") == [5, 6, 10, 7, 8, 9, 13, 14, 11]
    # Accents are stripped; a word with no vocabulary pieces is one [UNK].
    assert tokenizer.tokenize("Héllo zebra") == [12, 1]
    # Special token strings in the text are read as the special token.
    assert tokenizer.tokenize("the [MASK] fox") == [5, 4, 9]
    assert tokenizer.detokenize([2, 5, 6, 10, 7, 8, 9, 3, 0, 0]) == "the quick , brownish fox"
    cased = WordPieceTokenizer.from_vocabulary(vocabulary, lowercase=False)
    assert cased.tokenize("The fox") == [1, 9]


def test_byte_pair_ids_on_a_hand_written_vocabulary():
    vocabulary = {"<|endoftext|>": 0, "h": 1, "e": 2, "l": 3, "o": 4, "Ġ": 5, "w": 6, "r": 7,
                  "d": 8, "he": 9, "ll": 10, "hell": 11, "hello": 12, "Ġw": 13, "or": 14,
                  "Ġwor": 15}  # fmt: skip
    merges = ["h e", "l l", "he ll", "hell o", ("Ġ", "w"), "o r", "Ġw or"]
    tokenizer = BytePairTokenizer.from_vocabulary(vocabulary, merges)
    # "hello" merges all the way; "Ġworld" stops at Ġwor (no "Ġwor l" merge).
    assert tokenizer.tokenize("hello world") == [12, 15, 3, 8]
    # Without a leading space "world" never gets "Ġw"; "Ġhello" has no "Ġ h" merge.
    assert tokenizer.tokenize("world hello") == [6, 14, 3, 8, 5, 12]
    assert tokenizer.tokenize("hello<|endoftext|>") == [12, 0]
    assert tokenizer.detokenize([0, 6, 14, 3, 8, 5, 12, 0]) == "world hello"


def test_unigram_ids_on_a_hand_written_vocabulary():
    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("▁", -3.0), ("▁the", -1.0),
              ("▁house", -2.0), ("▁h", -4.0), ("ouse", -4.0), ("h", -5.0), ("o", -5.0),
              ("s", -5.0), ("e", -5.0), ("u", -5.0), ("t", -5.0)]  # fmt: skip
    tokenizer = UnigramTokenizer.from_vocabulary(pieces)
    # ▁house (-2) beats ▁h + ouse (-8).
    assert tokenizer.tokenize("the house") == [4, 5]
    # ▁h o s e (-19) beats ▁ h o s e (-23).
    assert tokenizer.tokenize("the hose") == [4, 6, 9, 10, 11]
    # "z" is in no piece: <unk>, which detokenize drops.
    assert tokenizer.tokenize("the zoo") == [4, 3, 2, 9, 9]
    assert tokenizer.detokenize([4, 3, 2, 9, 9, 1, 0]) == "the oo"


# === Training ===


@pytest.mark.parametrize("cls", CLASSES, ids=lambda cls: cls.__name__)
def test_training_builds_a_vocabulary_of_the_requested_size(cls, trained, corpus):
    tokenizer = trained[cls]
    assert type(tokenizer) is cls
    assert tokenizer.vocabulary_size == VOCABULARY_SIZE
    # Learned subwords: the corpus takes far fewer tokens than it has non-blank characters
    # (character-level tokens would take at least as many).
    text = "".join(corpus)
    assert len(tokenizer.tokenize(text)) < 0.8 * len("".join(text.split()))
    # Every id maps to a token and back.
    for token_id in range(tokenizer.vocabulary_size):
        assert tokenizer.token_to_id(tokenizer.id_to_token(token_id)) == token_id


def test_trained_special_tokens(trained):
    word_piece = trained[WordPieceTokenizer]
    assert [word_piece.id_to_token(i) for i in range(5)] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]",
                                                             "[MASK]"]  # fmt: skip
    assert (word_piece.pad_token_id, word_piece.unk_token_id, word_piece.cls_token_id,
            word_piece.sep_token_id, word_piece.mask_token_id) == (0, 1, 2, 3, 4)  # fmt: skip
    assert word_piece.bos_token_id is None and word_piece.eos_token_id is None

    byte_pair = trained[BytePairTokenizer]
    end_of_text = byte_pair.token_to_id("<|endoftext|>")
    assert byte_pair.bos_token_id == byte_pair.eos_token_id == byte_pair.pad_token_id == end_of_text
    assert (byte_pair.unk_token_id, byte_pair.mask_token_id, byte_pair.cls_token_id,
            byte_pair.sep_token_id) == (None, None, None, None)  # fmt: skip

    unigram = trained[UnigramTokenizer]
    assert [unigram.id_to_token(i) for i in range(3)] == ["<pad>", "</s>", "<unk>"]
    assert (unigram.pad_token_id, unigram.eos_token_id, unigram.unk_token_id) == (0, 1, 2)
    assert unigram.decoder_start_token_id == 0
    assert unigram.bos_token_id is None and unigram.mask_token_id is None


def test_byte_pair_vocabulary_holds_every_byte(trained):
    tokenizer = trained[BytePairTokenizer]
    byte_table = _gpt2_byte_table()
    for byte in range(256):
        assert tokenizer.token_to_id(byte_table[byte]) is not None
    # The tokens of any text spell out its UTF-8 bytes through GPT-2's byte table.
    byte_of = {char: byte for byte, char in byte_table.items()}
    ids = tokenizer.tokenize(NOVEL_TEXT)
    spelled = bytes(byte_of[char] for i in ids for char in tokenizer.id_to_token(i))
    assert spelled == NOVEL_TEXT.encode("utf-8")


def test_no_special_tokens_are_added(trained, corpus):
    for tokenizer in trained.values():
        special = {i for i in tokenizer._special_token_ids.values() if i is not None}
        assert not special & set(tokenizer.tokenize("".join(corpus[:50])))
        assert tokenizer.tokenize("") == []
        assert tokenizer.tokenize([]) == []


# === Round trip, as each class documents it ===


def test_byte_pair_round_trip_is_exact(trained, corpus):
    tokenizer = trained[BytePairTokenizer]
    texts = corpus + [NOVEL_TEXT, "   leading spaces", "trailing\n\n", "".join(corpus)]
    assert tokenizer.detokenize(tokenizer.tokenize(texts)) == texts


def test_word_piece_round_trip_is_up_to_bert_normalisation(trained, corpus):
    tokenizer = trained[WordPieceTokenizer]
    texts = [line for line in corpus if line.isascii()]
    assert len(texts) > 0.9 * len(corpus)
    texts += ["Hello,   WORLD!\n\tIt's 42.", "x=(a+b)*c_d"]
    expected = [_bert_detokenized(text) for text in texts]
    assert tokenizer.detokenize(tokenizer.tokenize(texts)) == expected
    assert tokenizer.detokenize(tokenizer.tokenize("Café")) == "cafe"


def test_unigram_round_trip_is_exact_but_for_one_leading_space(trained, corpus):
    tokenizer = trained[UnigramTokenizer]
    # The corpus lines keep their indentation, newlines and runs of spaces; only a leading space
    # is lost (SentencePiece's rule).
    expected = [line[1:] if line.startswith(" ") else line for line in corpus]
    assert tokenizer.detokenize(tokenizer.tokenize(corpus)) == expected
    whole = "".join(corpus)
    assert tokenizer.detokenize(tokenizer.tokenize(whole)) == whole
    # NFKC normalisation: the "ﬁ" ligature comes back as "fi".
    text = "the ﬁle"
    assert tokenizer.detokenize(tokenizer.tokenize(text)) == unicodedata.normalize("NFKC", text)
    # A character never seen in training is <unk>, dropped by detokenize.
    ids = tokenizer.tokenize("a🤖b")
    assert tokenizer.unk_token_id in ids
    assert tokenizer.detokenize(ids) == "ab"


# === Batches ===


@pytest.mark.parametrize("cls", CLASSES, ids=lambda cls: cls.__name__)
def test_batch_matches_single(cls, trained, corpus):
    tokenizer = trained[cls]
    texts = corpus[:40]
    rows = tokenizer.tokenize(texts)
    assert rows == [tokenizer.tokenize(text) for text in texts]
    assert tokenizer.tokenize(tuple(texts)) == rows
    assert tokenizer.tokenize(np.array(texts)) == rows
    singles = [tokenizer.detokenize(row) for row in rows]
    # Ragged lists, and a padded integer array whose padding detokenize skips.
    assert tokenizer.detokenize(rows) == singles
    padded = np.full((len(rows), max(map(len, rows)) + 3), tokenizer.pad_token_id, np.int32)
    for index, row in enumerate(rows):
        padded[index, : len(row)] = row
    assert tokenizer.detokenize(padded) == singles
    assert tokenizer.detokenize(padded[1]) == singles[1]
    assert tokenizer.detokenize(tuple(rows[1])) == singles[1]
    assert tokenizer.detokenize(np.array(rows[1], np.int64)) == singles[1]
    assert tokenizer.detokenize([]) == ""


# === Saving and loading ===


def assert_same_segmentations(a, b, texts):
    """`a` and `b` tokenize `texts` identically; for Unigram, up to exact ties.

    Two instances of one Unigram model were seen once to pick different segmentations of exactly
    equal score ("==" "=" "=" "=" "==" vs "==" "==" "=" "=" "="): most likely the `tokenizers`
    library breaks exact ties in an instance-dependent order. Anything else must be identical.
    """
    ids_a, ids_b = a.tokenize(texts), b.tokenize(texts)
    if a.backend_tokenizer.to_str() != b.backend_tokenizer.to_str():
        raise AssertionError("the two tokenizers serialise differently")
    model = json.loads(a.backend_tokenizer.to_str())["model"]
    for text, x, y in zip(texts, ids_a, ids_b):
        if x == y:
            continue
        assert model["type"] == "Unigram", (text, x, y)
        scores = [score for _, score in model["vocab"]]
        assert abs(sum(scores[i] for i in x) - sum(scores[i] for i in y)) < 1e-9, (text, x, y)
        assert a.detokenize([x]) == a.detokenize([y]), (text, x, y)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda cls: cls.__name__)
def test_save_and_load_give_identical_ids(cls, trained, corpus, tmp_path):
    tokenizer = trained[cls]
    tokenizer.save(tmp_path / "saved")
    assert sorted(os.listdir(tmp_path / "saved")) == ["tokenizer.json", "tokenizer_config.json"]
    with open(tmp_path / "saved" / "tokenizer_config.json") as file:
        config = json.load(file)
    assert config["class_name"] == cls.__name__
    assert {name: config[name] for name in tokenizer.special_tokens} == tokenizer.special_tokens

    for loader in (Tokenizer, cls):
        loaded = loader.load(tmp_path / "saved")
        assert type(loaded) is cls
        assert_same_segmentations(loaded, tokenizer, corpus + [NOVEL_TEXT])
        assert loaded.special_tokens == tokenizer.special_tokens
        assert loaded._special_token_ids == tokenizer._special_token_ids
        assert loaded.vocabulary_size == tokenizer.vocabulary_size

    other = next(c for c in CLASSES if c is not cls)
    with pytest.raises(ValueError, match=f"holds a {cls.__name__}, not a {other.__name__}"):
        other.load(tmp_path / "saved")


@pytest.mark.parametrize("cls", CLASSES, ids=lambda cls: cls.__name__)
def test_config_round_trip(cls, trained, corpus):
    tokenizer = trained[cls]
    config = json.loads(json.dumps(tokenizer.to_config()))
    assert config["class_name"] == cls.__name__
    for loader in (Tokenizer, cls):
        rebuilt = loader.from_config(config)
        assert type(rebuilt) is cls
        assert_same_segmentations(rebuilt, tokenizer, corpus)
        assert rebuilt.special_tokens == tokenizer.special_tokens
    other = next(c for c in CLASSES if c is not cls)
    with pytest.raises(ValueError, match=f"holds a {cls.__name__}, not a {other.__name__}"):
        other.from_config(config)
    with pytest.raises(ValueError, match="tokenizer_json"):
        cls.from_config({**config, "tokenizer_json": "{}"})
    with pytest.raises(ValueError, match="class_name='Nope'"):
        Tokenizer.from_config({**config, "class_name": "Nope"})


def test_from_file_with_explicit_special_tokens(trained, tmp_path):
    trained[BytePairTokenizer].save(tmp_path)
    path = tmp_path / "tokenizer.json"
    generic = Tokenizer.from_file(path)
    assert type(generic) is Tokenizer
    assert generic.eos_token_id is None and generic.pad_token_id is None
    gpt = BytePairTokenizer.from_file(path, pad_token=None)
    assert gpt.pad_token_id is None and gpt.eos_token_id == gpt.token_to_id("<|endoftext|>")
    assert gpt.tokenize(NOVEL_TEXT) == trained[BytePairTokenizer].tokenize(NOVEL_TEXT)


# === Errors ===


def test_input_type_errors(trained):
    tokenizer = trained[WordPieceTokenizer]
    with pytest.raises(ValueError, match="inputs of type int"):
        tokenizer.tokenize(3)
    with pytest.raises(ValueError, match="inputs of type bytes"):
        tokenizer.tokenize(b"text")
    with pytest.raises(ValueError, match="element 1 has type NoneType"):
        tokenizer.tokenize(["text", None])
    with pytest.raises(ValueError, match="dtype float"):
        tokenizer.detokenize([1.0, 2.0])
    with pytest.raises(ValueError, match="Received: id -1"):
        tokenizer.detokenize([5, -1])
    with pytest.raises(ValueError, match=f"Received: id {VOCABULARY_SIZE}"):
        tokenizer.detokenize(np.array([[5, VOCABULARY_SIZE]]))
    with pytest.raises(ValueError, match="3 dimension"):
        tokenizer.detokenize(np.zeros((1, 2, 3), np.int32))
    with pytest.raises(ValueError, match="'no-such-token'"):
        tokenizer.token_to_id("no-such-token")
    with pytest.raises(ValueError, match=f"token_id={VOCABULARY_SIZE}"):
        tokenizer.id_to_token(VOCABULARY_SIZE)


def test_training_errors(corpus):
    with pytest.raises(ValueError, match="vocabulary_size=100"):
        BytePairTokenizer.train(corpus, 100)  # below 256 bytes + <|endoftext|>
    with pytest.raises(ValueError, match="vocabulary_size=50"):
        WordPieceTokenizer.train(corpus, 50)  # below the corpus's distinct characters
    with pytest.raises(ValueError, match="vocabulary_size=50"):
        UnigramTokenizer.train(corpus, 50)
    with pytest.raises(ValueError, match="vocabulary_size=3"):
        UnigramTokenizer.train(corpus, 3)
    with pytest.raises(ValueError, match="of type float"):
        WordPieceTokenizer.train(corpus, 500.0)
    with pytest.raises(ValueError, match="texts of type str"):
        WordPieceTokenizer.train("a single string", 500)
    with pytest.raises(ValueError, match="element 1 of type int"):
        BytePairTokenizer.train(["text", 7], 300)


def test_file_errors(tmp_path, trained):
    missing = tmp_path / "missing" / "tokenizer.json"
    with pytest.raises(ValueError, match=re.escape(repr(str(missing)))):
        WordPieceTokenizer.from_file(missing)
    with pytest.raises(ValueError, match=re.escape(repr(str(tmp_path / "tokenizer_config.json")))):
        Tokenizer.load(tmp_path)
    (tmp_path / "tokenizer.json").write_text("not json")
    with pytest.raises(ValueError, match="Could not read"):
        Tokenizer.from_file(tmp_path / "tokenizer.json")
    (tmp_path / "tokenizer_config.json").write_text('{"tokenizer_class": "BertTokenizer"}')
    with pytest.raises(ValueError, match="class_name=None"):
        Tokenizer.load(tmp_path)


def test_constructor_errors(trained):
    backend = trained[BytePairTokenizer].backend_tokenizer
    with pytest.raises(ValueError, match="tokenizer of type str"):
        BytePairTokenizer("tokenizer.json")
    with pytest.raises(ValueError, match="wraps a WordPiece model.*has a BPE model"):
        WordPieceTokenizer(backend)
    with pytest.raises(ValueError, match="mask_token='<mask>'"):
        BytePairTokenizer(backend, mask_token="<mask>")
    with pytest.raises(ValueError, match="beginning_token"):
        BytePairTokenizer(backend, beginning_token="<|endoftext|>")
    with pytest.raises(ValueError, match="vocabulary of type str"):
        WordPieceTokenizer.from_vocabulary("vocab.txt")
    with pytest.raises(ValueError, match="merge='abc'"):
        BytePairTokenizer.from_vocabulary({"<|endoftext|>": 0}, ["abc"])


# === Hugging Face transformers: the same ids from its own pipelines ===


def _ascii_single_spaced(corpus):
    """Corpus lines as T5 sees text: ASCII words separated by single spaces."""
    lines = (" ".join(line.split()) for line in corpus if line.isascii())
    return [line for line in lines if line]


def test_matches_transformers_bert(trained, corpus, tmp_path):
    transformers = pytest.importorskip("transformers")
    ours = trained[WordPieceTokenizer]
    theirs = transformers.BertTokenizer(vocab=ours.backend_tokenizer.get_vocab(),
                                        do_lower_case=True)  # fmt: skip
    texts = corpus + [NOVEL_TEXT, "Hello, [MASK] world!"]
    assert [theirs.encode(t, add_special_tokens=False) for t in texts] == ours.tokenize(texts)
    assert (theirs.pad_token_id, theirs.unk_token_id, theirs.cls_token_id, theirs.sep_token_id,
            theirs.mask_token_id) == (ours.pad_token_id, ours.unk_token_id, ours.cls_token_id,
                                      ours.sep_token_id, ours.mask_token_id)  # fmt: skip
    # A tokenizer.json written by transformers loads with from_file and gives the same ids.
    theirs.save_pretrained(tmp_path)
    loaded = WordPieceTokenizer.from_file(tmp_path / "tokenizer.json")
    assert loaded.tokenize(texts) == ours.tokenize(texts)
    assert loaded.mask_token_id == theirs.mask_token_id


def test_matches_transformers_gpt2(trained, corpus, tmp_path):
    transformers = pytest.importorskip("transformers")
    ours = trained[BytePairTokenizer]
    model = json.loads(ours.backend_tokenizer.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    theirs = transformers.GPT2Tokenizer(vocab=model["vocab"], merges=merges)
    texts = corpus + [NOVEL_TEXT, "".join(corpus)]
    assert [theirs.encode(t, add_special_tokens=False) for t in texts] == ours.tokenize(texts)
    assert theirs.eos_token_id == ours.eos_token_id
    theirs.save_pretrained(tmp_path)
    loaded = BytePairTokenizer.from_file(tmp_path / "tokenizer.json")
    assert loaded.tokenize(texts) == ours.tokenize(texts)
    assert loaded.detokenize(loaded.tokenize(NOVEL_TEXT)) == NOVEL_TEXT


def test_matches_transformers_t5(trained, corpus, tmp_path):
    transformers = pytest.importorskip("transformers")
    ours = trained[UnigramTokenizer]
    model = json.loads(ours.backend_tokenizer.to_str())["model"]
    theirs = transformers.T5Tokenizer(vocab=[tuple(piece) for piece in model["vocab"]],
                                      extra_ids=0)  # fmt: skip
    texts = _ascii_single_spaced(corpus)
    assert len(texts) > 500
    assert [theirs.encode(t, add_special_tokens=False) for t in texts] == ours.tokenize(texts)
    assert (theirs.pad_token_id, theirs.eos_token_id, theirs.unk_token_id) == (
        ours.pad_token_id, ours.eos_token_id, ours.unk_token_id)  # fmt: skip
    # T5's own file (whitespace split before the metaspace) loads with from_file: same ids as
    # transformers on any text, runs of whitespace included.
    theirs.save_pretrained(tmp_path)
    loaded = UnigramTokenizer.from_file(tmp_path / "tokenizer.json")
    texts = corpus[:200]
    assert loaded.tokenize(texts) == [theirs.encode(t, add_special_tokens=False) for t in texts]


@pytest.mark.parametrize("cls", CLASSES, ids=lambda cls: cls.__name__)
def test_transformers_reads_our_saved_directory(cls, trained, corpus, tmp_path):
    transformers = pytest.importorskip("transformers")
    ours = trained[cls]
    ours.save(tmp_path)
    theirs = transformers.PreTrainedTokenizerFast.from_pretrained(str(tmp_path))
    texts = corpus[:200] + [NOVEL_TEXT]
    assert [theirs.encode(t, add_special_tokens=False) for t in texts] == ours.tokenize(texts)
    assert (theirs.pad_token_id, theirs.eos_token_id) == (ours.pad_token_id, ours.eos_token_id)


# === Packaging ===


def test_public_api():
    import keras_transformer.tokenizers as package

    assert sorted(package.__all__) == sorted(cls.__name__ for cls in (Tokenizer, *CLASSES))


def test_imports_no_deep_learning_framework():
    # Import the subpackage under an empty stand-in for the top-level package, whose own
    # __init__ (not ours) loads Keras: this checks the tokenizer modules alone.
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = (
        "import os, sys, types\n"
        "package = types.ModuleType('keras_transformer')\n"
        f"package.__path__ = [os.path.join({root!r}, 'keras_transformer')]\n"
        "sys.modules['keras_transformer'] = package\n"
        "import keras_transformer.tokenizers\n"
        "print(sorted(m for m in ('keras', 'tensorflow', 'jax', 'torch') if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)  # fmt: skip
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize(
    "module", [tokenizer_module, word_piece_module, byte_pair_module, unigram_module],
    ids=lambda module: module.__name__.rsplit(".", 1)[-1],
)  # fmt: skip
def test_docstring_examples_run(module):
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0
    assert result.failed == 0
