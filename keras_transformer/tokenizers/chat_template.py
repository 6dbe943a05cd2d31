"""Chat templates: a tokenizer's jinja2 template that turns messages into one prompt string.

A Hugging Face checkpoint keeps its template in `chat_template.jinja` (transformers 5) or under
`"chat_template"` in `tokenizer_config.json`; `read_chat_template` finds it. `render` runs it
the way `transformers` does (`apply_chat_template`), so the same messages give the same string:
a sandboxed jinja2 environment (`ImmutableSandboxedEnvironment`: templates come from model
repositories, untrusted), `trim_blocks` and `lstrip_blocks`, the `loopcontrols` extension, and
the helpers templates call: `raise_exception(message)`, the `tojson` filter (no HTML escaping,
`ensure_ascii=False`), `strftime_now(format)`, `dict(...)` and `namespace(...)`. The variables are
`messages`, `add_generation_prompt`, `tools`, `documents`, the tokenizer's special token strings
(`bos_token`, `eos_token`, ...) and any extra the caller passes.

The rendered string already holds every special token the template writes (e.g. a leading
`bos_token`): it is tokenized with no special token added (`Tokenizer.tokenize`).

This file is the one implementation of chat templates and of chat-message checks: the Keras
tokenizer imports it, an ONNX export copies it into the bundle (`keras_transformer/export/onnx.py`, `SHARED_FILES`),
where the Keras-free runner and server import it. It therefore imports nothing from Keras or
keras_transformer (the standard library, and jinja2 when a template renders).
"""

import datetime
import functools
import json
import os

CHAT_TEMPLATE_FILE = "chat_template.jinja"
# The roles a special token can play, the names of Hugging Face's `tokenizer_config.json` keys: a template
# reads each token's string under its role (`bos_token`, ...). The one list, for the tokenizer and the bundle.
SPECIAL_TOKEN_NAMES = ("pad_token", "bos_token", "eos_token", "unk_token", "mask_token", "cls_token", "sep_token")
# Older jinja2 releases have known sandbox escapes (transformers refuses them too).
_MIN_JINJA2 = (3, 1, 6)


def read_chat_template(directory, tokenizer_config):
    """The chat template of a tokenizer directory, or None when it has none.

    `chat_template.jinja` wins over `tokenizer_config.json`'s `"chat_template"`, as in
    `transformers`; the latter is a string, or a list of `{"name", "template"}` of which the one
    named "default" is used.

    Args:
        directory: the tokenizer (or checkpoint, or preset) directory.
        tokenizer_config: its `tokenizer_config.json`, as a dict (empty if it has none).
    """
    path = os.path.join(os.fspath(directory), CHAT_TEMPLATE_FILE)
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as file:
            return file.read()
    template = tokenizer_config.get("chat_template")
    if template is None or isinstance(template, str):
        return template
    if isinstance(template, list) and all(isinstance(entry, dict) for entry in template):
        named = {entry.get("name"): entry.get("template") for entry in template}
        if isinstance(named.get("default"), str):
            return named["default"]
    raise ValueError(
        "`chat_template` in tokenizer_config.json must be a string or a list of "
        '{"name", "template"} holding one named "default". Received: chat_template of type '
        f"{type(template).__name__} in {os.fspath(directory)!r}"
    )


def apply(template, messages, add_generation_prompt=False, variables=None):
    """Chat messages -> the prompt string(s) `template` renders: a string for one conversation, a list for a list.

    Args:
        template: the jinja2 chat template (a string).
        messages: a conversation (a list of `{"role", "content"}` dicts) or a list of them.
        add_generation_prompt, variables: as `render`.
    """
    parsed = as_conversations(messages)
    if parsed is None:
        raise ValueError(
            "`messages` must be a conversation (a list of dicts with 'role' and 'content') or a list "
            f"of conversations. Received: messages of type {type(messages).__name__}"
        )
    single, conversations = parsed
    rendered = render(template, conversations, add_generation_prompt, variables)
    return rendered[0] if single else rendered


def check_template_kwargs(variables):
    """`variables` (`generate`'s and a server request's `chat_template_kwargs`), checked: None or a dict of the
    template's other variables (string keys; e.g. Qwen3's `enable_thinking`, `tools`), as `transformers`'
    `apply_chat_template(..., **kwargs)`. The messages and the generation prompt are not among them: a
    ValueError naming the argument."""
    if variables is None:
        return {}
    if not isinstance(variables, dict) or not all(isinstance(key, str) for key in variables):
        raise ValueError(
            "`chat_template_kwargs` must be None or a dict of template variables (string keys). Received: "
            f"chat_template_kwargs of type {type(variables).__name__}: {_short(variables)}"
        )
    reserved = sorted({"messages", "add_generation_prompt"} & set(variables))
    if reserved:
        raise ValueError(
            "`chat_template_kwargs` cannot set the variables generation sets itself (the messages, and the "
            f"assistant's turn opened). Received: chat_template_kwargs with {reserved}"
        )
    return dict(variables)


def as_conversations(inputs):
    """Chat inputs -> (single, conversations), or None when `inputs` are not messages.

    One conversation is a list of messages; a batch is a list of conversations. A message is a
    dict with a string `"role"` and a `"content"` (a string, a list of content parts, or None).

    Returns:
        None for inputs that hold no dict (strings, token ids); else `single` (True for one
        conversation) and the conversations as a list of lists of messages.
    """
    if isinstance(inputs, dict):
        raise ValueError(
            "Chat messages must come as a conversation, a list of messages: wrap the message in a "
            f"list. Received: a single message {_short(inputs)}"
        )
    if not isinstance(inputs, (list, tuple)) or not inputs:
        return None
    first = inputs[0]
    if isinstance(first, dict):
        single, conversations = True, [inputs]
    elif isinstance(first, (list, tuple)) and first and isinstance(first[0], dict):
        single, conversations = False, list(inputs)
    else:
        return None
    for index, conversation in enumerate(conversations):
        where = "the conversation" if single else f"conversation {index}"
        if not isinstance(conversation, (list, tuple)) or not conversation:
            raise ValueError(
                "A batch of chats must hold conversations, each a non-empty list of messages. "
                f"Received: {where} = {_short(conversation)}"
            )
        for position, message in enumerate(conversation):
            check_message(message, f"message {position} of {where}")
    return single, [list(conversation) for conversation in conversations]


def check_message(message, where):
    """A `ValueError` naming `where` (e.g. "message 2 of the conversation") unless `message` is a chat message:
    a dict with a string `"role"` and a `"content"` (a string, a list of content parts, or None)."""
    if not isinstance(message, dict):
        raise ValueError(
            'Each chat message must be a dict {"role": ..., "content": ...}. Received: '
            f"{where} = {_short(message)} of type {type(message).__name__}"
        )
    if not isinstance(message.get("role"), str):
        raise ValueError(
            f'Each chat message needs a string "role" (e.g. "user"). Received: {where} = {_short(message)}'
        )
    if "content" not in message:
        raise ValueError(f'Each chat message needs a "content". Received: {where} = {_short(message)}')
    if not isinstance(message["content"], (str, list, type(None))):
        raise ValueError(
            'A chat message\'s "content" must be a string, a list of content parts or None. Received: '
            f"{where} with content of type {type(message['content']).__name__}"
        )


def _short(value, limit=120):
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def render(template, conversations, add_generation_prompt=False, variables=None):
    """Renders each conversation with `template` -> a list of strings.

    Args:
        template: the jinja2 chat template (a string).
        conversations: a list of conversations (lists of message dicts; see `as_conversations`).
        add_generation_prompt: bool, end with the template's start of an assistant turn.
        variables: dict of other template variables (special tokens, `tools`, `documents`,
            template options such as `enable_thinking`).

    Raises:
        ValueError: for a template that does not compile, or that refuses the messages
            (`raise_exception` in the template), with the template's message.
    """
    import jinja2

    compiled = _compile(template)
    variables = {"tools": None, "documents": None, **_plain(variables or {})}
    rendered = []
    for conversation in conversations:
        try:
            rendered.append(
                compiled.render(
                    messages=_plain(list(conversation)), add_generation_prompt=bool(add_generation_prompt), **variables
                )
            )
        except jinja2.TemplateError as error:
            raise ValueError(f"The chat template could not render these messages: {error}") from error
    return rendered


@functools.lru_cache(maxsize=16)
def _compile(template):
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    version = tuple(int(part) for part in jinja2.__version__.split(".")[:3] if part.isdigit())
    if version < _MIN_JINJA2:
        raise ValueError(
            f"Chat templates need jinja2 >= {'.'.join(map(str, _MIN_JINJA2))} (older releases can be "
            f"escaped from the sandbox). Received: jinja2 {jinja2.__version__}; upgrade with "
            "`pip install -U jinja2`."
        )

    class _Generation(jinja2.ext.Extension):
        """`{% generation %}...{% endgeneration %}` (marks assistant text for training masks): renders its body."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    class _Dict:
        """`dict(...)` for templates, without the class itself (no attribute walk to Python internals)."""

        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    class _Namespace(jinja2.utils.Namespace):
        """`namespace(...)` that refuses underscore names (no way to reach CPython internals)."""

        def __init__(*args, **kwargs):  # jinja2's own signature trick: `namespace(self=...)` still works
            self, args = args[0], args[1:]
            attributes = dict(*args, **kwargs)
            for name in attributes:
                _Namespace._check(name)
            jinja2.utils.Namespace.__init__(self, attributes)

        def __setitem__(self, name, value):
            _Namespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    f"A chat template cannot set an underscore attribute on a namespace. Received: {name!r}"
                )

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.datetime.now().strftime(format)

    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols]
    )
    environment.filters["tojson"] = tojson
    environment.globals.update(
        raise_exception=raise_exception, strftime_now=strftime_now, dict=_Dict(), namespace=_Namespace
    )
    try:
        return environment.from_string(template)
    except jinja2.TemplateSyntaxError as error:
        raise ValueError(f"The chat template is not valid jinja2: {error} (line {error.lineno})") from error


def _plain(value):
    """A copy of `value` made of plain JSON types only: what a sandboxed template may see.

    Other objects (arrays, images, tensors in content parts) have methods the sandbox does not
    know to be unsafe; they become an inert placeholder "<TypeName>".
    """
    if value is None or type(value) in (str, int, float, bool):
        return value
    for kind in (str, int, float):
        if isinstance(value, kind):  # subclasses (enums, numpy scalars) lose their extra methods
            return kind(value)
    if isinstance(value, dict):
        return {_plain(key): _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_plain(item) for item in value)
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "shape", None) == ():  # a numpy scalar
        return _plain(item())
    return f"<{type(value).__name__}>"
