"""Tokenizer: the base of our thin wrappers over the Hugging Face `tokenizers` library.

A tokenizer here is plain Python (not a Keras layer): preprocessing runs in numpy, outside the
graph, so this subpackage imports neither Keras nor any backend. The heavy lifting (normalising,
pre-tokenising, the subword model, decoding, training) is done by `tokenizers`; this class adds a
small, uniform API, named special tokens, a chat template (see `chat_template.py`), and a save
format (`tokenizer.json` + `tokenizer_config.json`).

The jobs around the class live beside it: `special_tokens.py` checks the special token arguments,
`tokenizer_files.py` writes and reads the save format (and keeps the class registry that `load`
uses), `training.py` holds what the subclasses' `train` share, and `chat_template.py` renders chats.
"""

import operator
import os

import numpy as np
import tokenizers

from keras_transformer.tokenizers import chat_template as chat
from keras_transformer.tokenizers import tokenizer_files
from keras_transformer.tokenizers import training
from keras_transformer.tokenizers.special_tokens import (
    SPECIAL_TOKEN_NAMES,
    check_special_token_names,
    register_special_tokens,
)
from keras_transformer.tokenizers.tokenizer_files import CONFIG_FILE, TOKENIZER_FILE

__all__ = ["CONFIG_FILE", "SPECIAL_TOKEN_NAMES", "TOKENIZER_FILE", "Tokenizer"]


class Tokenizer:
    """A tokenizer wrapping a Hugging Face `tokenizers.Tokenizer`.

    `tokenize` turns text into token ids without adding any special token (preprocessors add
    BOS/EOS/CLS/SEP themselves, where each model wants them); `detokenize` turns ids back into
    text, dropping special tokens (padding included). Every special token is registered as such
    with the wrapped tokenizer, so that its string in the input text becomes its id (as with
    Hugging Face `transformers`) and `detokenize` skips it.

    This base class works with any `tokenizers.Tokenizer`; the subclasses `WordPieceTokenizer`
    (BERT), `BytePairTokenizer` (GPT-2) and `UnigramTokenizer` (T5) fix the model kind and the
    default special tokens, and can `train` a new vocabulary.

    Args:
        tokenizer: a `tokenizers.Tokenizer`. The special tokens below are registered with it
            (their ids do not change).
        **special_tokens: the token string for any of `pad_token`, `bos_token`, `eos_token`,
            `unk_token`, `mask_token`, `cls_token`, `sep_token`; `None` where the tokenizer has no
            such token. Each string must be in the vocabulary. Roles not given take the class's
            `default_special_tokens` (none for this base class).
        chat_template: None, or the jinja2 chat template (a string, as in a Hugging Face
            `tokenizer_config.json`) that `apply_chat_template` renders messages with.

    Attributes:
        source: the directory the tokenizer was read from (`load`, `from_file`, a converted
            checkpoint), or None; named by errors.

    Example:

    >>> import tokenizers
    >>> backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(
    ...     {"<unk>": 0, "hello": 1, "world": 2}, unk_token="<unk>"))
    >>> backend.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    >>> tokenizer = Tokenizer(backend, unk_token="<unk>")
    >>> tokenizer.tokenize(["hello world", "world"])
    [[1, 2], [2]]
    >>> tokenizer.unk_token_id, tokenizer.pad_token_id
    (0, None)
    """

    # Role -> token string used where the constructor is not given that role.
    default_special_tokens = {}
    # The `tokenizers.models` class a subclass wraps (checked by the constructor); None: any.
    model_type = None

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        tokenizer_files.register(cls)

    def __init__(self, tokenizer, chat_template=None, **special_tokens):
        if not isinstance(tokenizer, tokenizers.Tokenizer):
            raise ValueError(
                "`tokenizer` must be a `tokenizers.Tokenizer` (to read a tokenizer.json file, use "
                f"`{type(self).__name__}.from_file`). Received: tokenizer of type "
                f"{type(tokenizer).__name__}"
            )
        if self.model_type is not None and not isinstance(tokenizer.model, self.model_type):
            raise ValueError(
                f"{type(self).__name__} wraps a {self.model_type.__name__} model, but the tokenizer "
                f"given has a {type(tokenizer.model).__name__} model."
            )
        check_special_token_names(special_tokens)
        self.backend_tokenizer = tokenizer
        self.chat_template = chat_template
        self.source = None
        # Role -> token string (or None), and role -> id (or None), for every role.
        self.special_tokens, self._special_token_ids = register_special_tokens(
            tokenizer, special_tokens, self.default_special_tokens
        )

    # === Text <-> ids ===

    def tokenize(self, inputs):
        """Turns text into token ids, adding no special token and no padding.

        Args:
            inputs: a string, or a list (or tuple, or 1-D numpy array) of strings.

        Returns:
            A `list[int]` for a string; a `list[list[int]]` (rows of different lengths) for a list.
        """
        if isinstance(inputs, str):
            return self.backend_tokenizer.encode(inputs, add_special_tokens=False).ids
        if isinstance(inputs, np.ndarray) and inputs.ndim == 1:
            inputs = inputs.tolist()
        if not isinstance(inputs, (list, tuple)):
            raise ValueError(
                f"`tokenize` expects a string or a list of strings. Received: inputs of type {type(inputs).__name__}"
            )
        for index, text in enumerate(inputs):
            if not isinstance(text, str):
                raise ValueError(
                    "`tokenize` expects a string or a list of strings. Received: a list whose "
                    f"element {index} has type {type(text).__name__}"
                )
        encodings = self.backend_tokenizer.encode_batch(list(inputs), add_special_tokens=False)
        return [encoding.ids for encoding in encodings]

    def detokenize(self, ids):
        """Turns token ids back into text, skipping special tokens (padding included).

        `detokenize(tokenize(text))` gives back `text` up to what the tokenizer normalises: see
        each subclass for what that is.

        Args:
            ids: one sequence of ids (a list of ints or a 1-D integer array), or a batch of them
                (a list of such sequences, possibly of different lengths, or a 2-D integer array).

        Returns:
            A `str` for one sequence; a `list[str]` for a batch.
        """
        if isinstance(ids, (list, tuple)) and any(isinstance(row, (list, tuple, np.ndarray)) for row in ids):
            rows = [self._check_ids(row) for row in ids]
            return self.backend_tokenizer.decode_batch(rows, skip_special_tokens=True)
        array = np.asarray(ids)
        if array.ndim == 1:
            return self.backend_tokenizer.decode(self._check_ids(array), skip_special_tokens=True)
        if array.ndim == 2:
            rows = [self._check_ids(row) for row in array]
            return self.backend_tokenizer.decode_batch(rows, skip_special_tokens=True)
        raise ValueError(
            "`detokenize` expects a 1-D sequence of ids or a 2-D batch of them. Received: ids "
            f"with {array.ndim} dimension(s) (shape {array.shape})"
        )

    def _check_ids(self, row):
        """Returns `row` as a list of ints after checking that each is a valid id."""
        row = np.asarray(row)
        if row.size == 0:
            return []
        if row.ndim != 1 or row.dtype.kind not in "iu":
            raise ValueError(
                f"`detokenize` expects integer token ids. Received: a row of dtype {row.dtype} and shape {row.shape}"
            )
        bad = row[(row < 0) | (row >= self.vocabulary_size)]
        if bad.size:
            raise ValueError(f"`detokenize` got an id outside [0, {self.vocabulary_size}). Received: id {bad[0]}")
        return row.tolist()

    # === Chat ===

    @property
    def chat_template(self):
        """The jinja2 chat template (a string), or None; settable (e.g. to give a base model one)."""
        return self._chat_template

    @chat_template.setter
    def chat_template(self, template):
        if template is not None and not isinstance(template, str):
            raise ValueError(
                "`chat_template` must be a jinja2 template string or None. Received: chat_template of "
                f"type {type(template).__name__}"
            )
        self._chat_template = template

    def apply_chat_template(self, messages, add_generation_prompt=False, **template_variables):
        """Renders chat messages into the prompt string the model was trained on, as `transformers` does.

        The result equals `transformers`' `apply_chat_template(messages, tokenize=False, ...)` for
        the same template; `tokenize` on it gives the ids of `apply_chat_template(..., tokenize=True)`
        (the template writes the special tokens, e.g. the start token, itself).

        Args:
            messages: a conversation, i.e. a list of dicts `{"role": "user", "content": "..."}`,
                or a list of conversations.
            add_generation_prompt: bool, end with the start of an assistant turn (what a model
                continues to answer); False by default, as in `transformers`.
            **template_variables: other variables the template reads (e.g. `tools`, `documents`,
                `enable_thinking`); the special token strings (`bos_token`, ...) are set already.

        Returns:
            A string for one conversation; a list of strings for a list of conversations.

        Example:

        >>> tokenizer = Tokenizer(tokenizers.Tokenizer(tokenizers.models.WordLevel({"<unk>": 0}, "<unk>")))
        >>> tokenizer.chat_template = (
        ...     "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\\n{% endfor %}"
        ...     "{% if add_generation_prompt %}<|assistant|>{% endif %}")
        >>> tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
        '<|user|>Hi\\n<|assistant|>'
        """
        if self.chat_template is None:
            where = f"read from {self.source!r}" if self.source is not None else "built in memory"
            raise ValueError(
                f"This tokenizer ({where}) has no chat template, so it cannot turn chat messages into a "
                "prompt: its tokenizer_config.json has no 'chat_template' and there is no "
                f"{chat.CHAT_TEMPLATE_FILE}. Pass prompt strings instead, or set `tokenizer.chat_template` "
                "to a jinja2 template."
            )
        variables = {name: token for name, token in self.special_tokens.items() if token is not None}
        return chat.apply(self.chat_template, messages, add_generation_prompt, {**variables, **template_variables})

    # === Vocabulary ===

    @property
    def vocabulary_size(self):
        """Number of token ids, special tokens included."""
        return self.backend_tokenizer.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token):
        """Returns the id of `token`; raises `ValueError` when it is not in the vocabulary."""
        token_id = self.backend_tokenizer.token_to_id(token) if isinstance(token, str) else None
        if token_id is None:
            raise ValueError(f"`token` is not in the vocabulary. Received: token={token!r}")
        return token_id

    def id_to_token(self, token_id):
        """Returns the token string of `token_id`; raises `ValueError` when there is none."""
        try:
            index = operator.index(token_id)
        except TypeError:
            index = None
        token = None
        if index is not None and 0 <= index < self.vocabulary_size:
            token = self.backend_tokenizer.id_to_token(index)
        if token is None:
            raise ValueError(
                f"`token_id` must be an integer id in [0, {self.vocabulary_size}). Received: token_id={token_id!r}"
            )
        return token

    @property
    def pad_token_id(self):
        """Id of the padding token, or None."""
        return self._special_token_ids["pad_token"]

    @property
    def bos_token_id(self):
        """Id of the beginning-of-sequence token, or None."""
        return self._special_token_ids["bos_token"]

    @property
    def eos_token_id(self):
        """Id of the end-of-sequence token, or None."""
        return self._special_token_ids["eos_token"]

    @property
    def unk_token_id(self):
        """Id of the unknown token, or None."""
        return self._special_token_ids["unk_token"]

    @property
    def mask_token_id(self):
        """Id of the mask token (masked language modelling), or None."""
        return self._special_token_ids["mask_token"]

    @property
    def cls_token_id(self):
        """Id of the classification token that starts a BERT input, or None."""
        return self._special_token_ids["cls_token"]

    @property
    def sep_token_id(self):
        """Id of the separator token that ends each BERT segment, or None."""
        return self._special_token_ids["sep_token"]

    # === Saving and loading ===

    def save(self, directory):
        """Writes `tokenizer.json` (the `tokenizers` JSON) and `tokenizer_config.json` to `directory`.

        `tokenizer_config.json` holds our class name, the special token strings and the chat
        template (when there is one) under the keys Hugging Face uses, so
        `transformers.PreTrainedTokenizerFast.from_pretrained(directory)` also reads the directory.
        The directory is created if needed.

        Args:
            directory: path of the directory to write.
        """
        tokenizer_files.write(self, directory)

    @classmethod
    def load(cls, directory):
        """Reads a directory written by `save`, returning an instance of the class that saved it.

        Args:
            directory: path of a directory holding `tokenizer.json` and `tokenizer_config.json`.

        Returns:
            A `Tokenizer` of the saved subclass (which must be `cls` or a subclass of it).
        """
        config, config_path = tokenizer_files.read_config(directory)
        target = tokenizer_files.class_named(cls, config, source=repr(config_path))
        special_tokens = {name: config.get(name) for name in SPECIAL_TOKEN_NAMES}
        return target.from_file(
            os.path.join(os.fspath(directory), TOKENIZER_FILE),
            chat_template=chat.read_chat_template(directory, config),
            **special_tokens,
        )

    def to_config(self):
        """Returns the whole tokenizer as a JSON-serialisable dict (e.g. to embed in a model config).

        The dict holds what `save` writes: the `tokenizer_config.json` entries (the chat template
        under `"chat_template"`, None when there is none), plus the `tokenizers` JSON as a string
        under `"tokenizer_json"`.
        """
        return {
            "class_name": type(self).__name__,
            **self.special_tokens,
            "chat_template": self.chat_template,
            "tokenizer_json": self.backend_tokenizer.to_str(),
        }

    @classmethod
    def from_config(cls, config):
        """Rebuilds a tokenizer from `to_config`'s dict, as an instance of the class that wrote it.

        Args:
            config: a dict returned by `to_config`.

        Returns:
            A `Tokenizer` of the saved subclass (which must be `cls` or a subclass of it).
        """
        target = tokenizer_files.class_named(cls, config, source="the config")
        backend = tokenizer_files.backend_from_config(config)
        special_tokens = {name: config.get(name) for name in SPECIAL_TOKEN_NAMES}
        return target(backend, chat_template=config.get("chat_template"), **special_tokens)

    @classmethod
    def from_file(cls, path, chat_template=None, **special_tokens):
        """Reads a `tokenizers` JSON file, e.g. the `tokenizer.json` of a Hugging Face checkpoint.

        Args:
            path: path of the `tokenizer.json` file.
            chat_template: None or a jinja2 chat template, as in the constructor.
            **special_tokens: as in the constructor; roles not given take the class defaults.

        Returns:
            An instance of `cls`.
        """
        path = os.fspath(path)
        backend = tokenizer_files.read_backend(path)
        tokenizer = cls(backend, chat_template=chat_template, **special_tokens)
        tokenizer.source = os.path.dirname(os.path.abspath(path))
        return tokenizer

    # === Training (used by the subclasses' `train`) ===

    _check_vocabulary_size = staticmethod(training.check_vocabulary_size)
    _train_backend = staticmethod(training.train_backend)

    def __repr__(self):
        return f"{type(self).__name__}(vocabulary_size={self.vocabulary_size})"


tokenizer_files.register(Tokenizer)
