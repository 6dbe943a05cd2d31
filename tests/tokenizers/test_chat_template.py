"""Chat templates: rendering and token ids against `transformers`, generation from messages, presets, errors.

The peer is `transformers` on the same local checkpoint (a small random GPT-2 whose tokenizer has
a ChatML or a Llama-3 template, see `chat_models.py`): the rendered strings, the token ids and the
greedy continuations must be the same. The published templates of Qwen3, Gemma 3 and Phi-4-mini
(`chat_models.PUBLISHED`) are checked on a tokenizer alone: text and ids, thinking, tools and errors.
"""

import json

import jinja2
import numpy as np
import pytest
import torch
import transformers

from keras_transformer.convert.checkpoint import load_tokenizer
from keras_transformer.models import GPTCausalLM
from keras_transformer.tokenizers import BytePairTokenizer, Tokenizer, chat_template
from tests.tokenizers import chat_models
from tests.tokenizers.chat_models import CONVERSATIONS

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Météo d'une ville",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
TOOL_CONVERSATION = [
    {"role": "user", "content": "What is the weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
    },
    {"role": "tool", "content": "22°C, sunny"},
]


@pytest.fixture(scope="module", params=sorted(chat_models.STYLES))
def checkpoint(request, tmp_path_factory):
    """(style, directory, transformers model, transformers tokenizer, our GPTCausalLM)."""
    directory = tmp_path_factory.mktemp(request.param)
    hf = chat_models.chat_gpt2(directory, request.param)
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    return request.param, directory, hf, hf_tokenizer, GPTCausalLM.from_preset(directory)


def test_rendering_and_ids_match_transformers(checkpoint):
    style, _, _, hf_tokenizer, lm = checkpoint
    tokenizer = lm.preprocessor.tokenizer
    assert tokenizer.chat_template == chat_models.STYLES[style][0]
    for conversation in CONVERSATIONS:
        for add_generation_prompt in (True, False):
            ours = tokenizer.apply_chat_template(conversation, add_generation_prompt=add_generation_prompt)
            theirs = hf_tokenizer.apply_chat_template(
                conversation, tokenize=False, add_generation_prompt=add_generation_prompt
            )
            assert ours == theirs
        rendered = tokenizer.apply_chat_template(conversation, add_generation_prompt=True)
        assert tokenizer.tokenize(rendered) == chat_models.hf_ids(hf_tokenizer, conversation)
    # A batch of conversations renders each one.
    assert tokenizer.apply_chat_template(CONVERSATIONS, add_generation_prompt=True) == [
        tokenizer.apply_chat_template(c, add_generation_prompt=True) for c in CONVERSATIONS
    ]


def test_special_tokens_written_once(checkpoint):
    """The Llama template writes the start token: it is in the ids once (no preprocessor BOS on top)."""
    style, _, _, hf_tokenizer, lm = checkpoint
    tokenizer = lm.preprocessor.tokenizer
    ids = tokenizer.tokenize(tokenizer.apply_chat_template(CONVERSATIONS[1], add_generation_prompt=True))
    if style == "llama3":
        assert ids[0] == tokenizer.bos_token_id == hf_tokenizer.bos_token_id
        assert ids.count(tokenizer.bos_token_id) == 1
        assert ids.count(tokenizer.eos_token_id) == 4  # <|eot_id|> ends the system, user, assistant, user turns
    else:
        im_start = tokenizer.token_to_id("<|im_start|>")
        assert ids.count(im_start) == 5  # system, user, assistant, user, and the generation prompt
        assert tokenizer.bos_token_id not in ids


def test_tools_and_template_options_match_transformers(checkpoint):
    """Tools (through `tojson`, non-ASCII kept), tool calls, and an extra template variable."""
    style, _, _, hf_tokenizer, lm = checkpoint
    tokenizer = lm.preprocessor.tokenizer
    if style == "thinking":  # Qwen3's switch, a template variable: off opens an empty <think> block
        for enable_thinking in (False, True):
            ours = tokenizer.apply_chat_template(
                CONVERSATIONS[2][:3], add_generation_prompt=True, enable_thinking=enable_thinking
            )
            theirs = hf_tokenizer.apply_chat_template(
                CONVERSATIONS[2][:3], tokenize=False, add_generation_prompt=True, enable_thinking=enable_thinking
            )
            assert ours == theirs and ours.endswith("<think>\n\n</think>\n\n") is not enable_thinking
        assert "add two numbers" not in ours  # an earlier turn's reasoning is dropped
        # generate(messages, chat_template_kwargs=...) renders with them: the reply continues the switched prompt.
        options = {"enable_thinking": False}
        prompt = chat_models.hf_ids(hf_tokenizer, CONVERSATIONS[2][:3], **options)
        reply = lm.generate(CONVERSATIONS[2][:3], max_new_tokens=3, stop_token_ids=None, chat_template_kwargs=options)
        continued = lm.generate(prompt, max_new_tokens=3, stop_token_ids=None)
        assert reply == tokenizer.detokenize(continued[len(prompt) :])
        return
    if style == "chatml":
        ours = tokenizer.apply_chat_template(TOOL_CONVERSATION, add_generation_prompt=True, tools=TOOLS)
        theirs = hf_tokenizer.apply_chat_template(
            TOOL_CONVERSATION, tools=TOOLS, tokenize=False, add_generation_prompt=True
        )
        assert "Météo" in ours and '"city": "Paris"' in ours
    else:
        ours = tokenizer.apply_chat_template(CONVERSATIONS[0], date_string="26 Jul 2024")
        theirs = hf_tokenizer.apply_chat_template(CONVERSATIONS[0], date_string="26 Jul 2024", tokenize=False)
        assert "Today Date: 26 Jul 2024" in ours
    assert ours == theirs


def test_generate_messages_matches_prompt_ids_and_transformers(checkpoint):
    """Greedy: generate(messages) = generate(the rendered prompt's ids) = transformers' generate on its ids."""
    _, _, hf, hf_tokenizer, lm = checkpoint
    tokenizer = lm.preprocessor.tokenizer
    conversation = CONVERSATIONS[1]
    streamed = []
    reply = lm.generate(
        conversation, max_new_tokens=6, stop_token_ids=None, streamer=lambda tokens: streamed.append(int(tokens[0]))
    )
    prompt = chat_models.hf_ids(hf_tokenizer, conversation)
    from_ids = lm.generate(prompt, max_new_tokens=6, stop_token_ids=None)[len(prompt) :]
    with torch.no_grad():
        expected = hf.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            do_sample=False,
            max_new_tokens=6,
            eos_token_id=None,
            pad_token_id=0,
        )
    expected = expected[0, len(prompt) :].tolist()
    assert streamed == from_ids == expected
    assert len(set(expected)) >= 2
    assert reply == tokenizer.detokenize(expected)
    # The rendered string as a prompt, without the preprocessor's own start token, continues the same way.
    rendered = tokenizer.apply_chat_template(conversation, add_generation_prompt=True)
    lm.preprocessor.add_start_token = False
    try:
        as_text = lm.generate(rendered, max_new_tokens=6, stop_token_ids=None)
    finally:
        lm.preprocessor.add_start_token = True
    assert as_text == tokenizer.detokenize(prompt + expected)


def test_generate_a_batch_of_conversations(checkpoint):
    """Conversations of different lengths share a batch; each reply is the one it gets alone; return_dict too."""
    style, *_, lm = checkpoint
    if style != "chatml":  # each alone, the batch and a beam compile several loops: one template is enough
        pytest.skip("batching does not depend on the template: the chatml checkpoint checks it")
    alone = [lm.generate(c, max_new_tokens=5, stop_token_ids=None) for c in CONVERSATIONS]
    assert lm.generate(CONVERSATIONS, max_new_tokens=5, stop_token_ids=None) == alone
    result = lm.generate(CONVERSATIONS, max_new_tokens=5, stop_token_ids=None, return_dict=True)
    assert result["outputs"] == alone
    beams = lm.generate(CONVERSATIONS[0], max_new_tokens=4, stop_token_ids=None, sampler="beam")
    assert isinstance(beams, str)


def test_preset_round_trip_keeps_the_template(checkpoint, tmp_path):
    style, _, _, _, lm = checkpoint
    template = chat_models.STYLES[style][0]
    lm.save_to_preset(tmp_path / "preset")
    assert json.loads((tmp_path / "preset" / "tokenizer_config.json").read_text())["chat_template"] == template
    again = GPTCausalLM.from_preset(tmp_path / "preset")
    assert again.preprocessor.tokenizer.chat_template == template
    assert again.generate(CONVERSATIONS, max_new_tokens=4, stop_token_ids=None) == lm.generate(
        CONVERSATIONS, max_new_tokens=4, stop_token_ids=None
    )
    # transformers reads our preset's tokenizer, template included.
    hf_again = transformers.AutoTokenizer.from_pretrained(tmp_path / "preset")
    assert hf_again.apply_chat_template(CONVERSATIONS[1], tokenize=False, add_generation_prompt=True) == (
        lm.preprocessor.tokenizer.apply_chat_template(CONVERSATIONS[1], add_generation_prompt=True)
    )
    # to_config / from_config (what a .keras file holds).
    rebuilt = Tokenizer.from_config(lm.preprocessor.tokenizer.to_config())
    assert rebuilt.chat_template == template


def test_template_read_from_tokenizer_config(tmp_path):
    """Older checkpoints keep the template in tokenizer_config.json: a string, or named templates."""
    chat_models.chat_gpt2(tmp_path, "chatml")
    template = (tmp_path / "chat_template.jinja").read_text()
    (tmp_path / "chat_template.jinja").unlink()
    config_path = tmp_path / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    for entry in (template, [{"name": "tool_use", "template": "unused"}, {"name": "default", "template": template}]):
        config_path.write_text(json.dumps({**config, "chat_template": entry}))
        lm = GPTCausalLM.from_preset(tmp_path)
        assert lm.preprocessor.tokenizer.chat_template == template
    config_path.write_text(json.dumps({**config, "chat_template": [{"name": "tool_use", "template": "x"}]}))
    with pytest.raises(ValueError, match='named "default"'):
        GPTCausalLM.from_preset(tmp_path)


# --- published templates (Qwen3, Gemma 3, Phi-4-mini): rendering and ids only --------------------------


@pytest.fixture(scope="module", params=sorted(chat_models.PUBLISHED))
def published(request, tmp_path_factory):
    """(style, our tokenizer as a checkpoint's is read, transformers' tokenizer), both from the same directory."""
    directory = tmp_path_factory.mktemp(request.param)
    chat_models.chat_tokenizer(directory, request.param)
    return request.param, load_tokenizer(directory, {}, {}), transformers.AutoTokenizer.from_pretrained(directory)


def _same_as_transformers(tokenizer, hf_tokenizer, messages, add_generation_prompt, **options):
    """Asserts our text and ids equal transformers' for these messages and template options; returns the text."""
    ours = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, **options)
    theirs = hf_tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt, **options
    )
    assert ours == theirs, (messages, add_generation_prompt, options)
    ids = chat_models.hf_ids(hf_tokenizer, messages, add_generation_prompt=add_generation_prompt, **options)
    assert tokenizer.tokenize(ours) == ids
    return ours


def test_published_templates_render_and_ids_match_transformers(published):
    """Single turn, a system message and several turns, earlier reasoning; with and without the generation prompt,
    and Qwen3's `enable_thinking` unset, on and off."""
    style, tokenizer, hf_tokenizer = published
    assert tokenizer.chat_template == chat_models.PUBLISHED[style][0]
    switches = [{}, {"enable_thinking": True}, {"enable_thinking": False}] if style == "qwen3" else [{}]
    for conversation in CONVERSATIONS:
        for add_generation_prompt in (True, False):
            for options in switches:
                _same_as_transformers(tokenizer, hf_tokenizer, conversation, add_generation_prompt, **options)
    system_first = tokenizer.apply_chat_template(CONVERSATIONS[1], add_generation_prompt=True)
    opening, _ = PUBLISHED_TURNS[style]
    assert system_first.endswith(opening)
    if style == "gemma3":  # the system message folded into the first user turn, after the one <bos>
        assert system_first.startswith("<bos><start_of_turn>user\nYou write small Python functions.\n\nthe quick")
        assert tokenizer.tokenize(system_first).count(tokenizer.bos_token_id) == 1
    if style == "phi4_mini":  # without a generation prompt the chat is closed by the end token
        assert tokenizer.apply_chat_template(CONVERSATIONS[0]).endswith("<|end|><|endoftext|>")


# style -> (the generation prompt, a conversation using the template's own features: tools, reasoning, images)
PUBLISHED_TURNS = {
    "qwen3": ("<|im_start|>assistant\n", [
        {"role": "system", "content": "You write small Python functions."},
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": "", "reasoning_content": "I should call the tool.",
         "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "22°C, sunny"},
        {"role": "tool", "content": "Humidité 40 %"},
        {"role": "assistant", "content": "<think>\nboth answers in\n</think>\n\nSunny, 22°C.",
         "tool_calls": [{"function": {"name": "get_weather", "arguments": '{"city": "Lyon"}'}}]},
    ]),
    "gemma3": ("<start_of_turn>model\n", [
        {"role": "system", "content": [{"type": "text", "text": "Describe images. "}]},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "  What is this?  "}]},
    ]),
    "phi4_mini": ("<|assistant|>", [
        {"role": "system", "content": "You call tools.", "tools": json.dumps([t["function"] for t in TOOLS])},
        {"role": "user", "content": "What is the weather in Paris?"},
    ]),
}  # fmt: skip


def test_published_templates_tools_thinking_and_parts_render_and_ids(published):
    """Each template's own features: Qwen3's tools (`tojson`, non-ASCII kept), tool calls (arguments as a dict and
    as a string), tool responses and reasoning; Gemma 3's content parts; Phi-4-mini's tools in the system message."""
    style, tokenizer, hf_tokenizer = published
    _, conversation = PUBLISHED_TURNS[style]
    options = {"tools": TOOLS} if style == "qwen3" else {}
    for add_generation_prompt in (True, False):
        for thinking in ({}, {"enable_thinking": False}) if style == "qwen3" else ({},):
            text = _same_as_transformers(
                tokenizer, hf_tokenizer, conversation, add_generation_prompt, **options, **thinking
            )
    if style == "qwen3":
        assert "Météo" in text and '"arguments": {"city": "Paris"}' in text and '"arguments": {"city": "Lyon"}' in text
        assert "<think>\nboth answers in\n</think>\n\nSunny" in text  # after the last user turn: kept
        assert "I should call the tool." in text
    elif style == "gemma3":
        assert "<start_of_turn>user\nDescribe images. \n\n<start_of_image>What is this?<end_of_turn>" in text
    else:
        assert '<|system|>You call tools.<|tool|>[{"name": "get_weather"' in text


def test_published_templates_refusals_match_transformers(published):
    """What a template refuses, transformers refuses too: ours is a ValueError carrying the template's message."""
    style, tokenizer, hf_tokenizer = published
    if style != "gemma3":
        return
    messages = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    with pytest.raises(jinja2.TemplateError, match="must alternate"):
        hf_tokenizer.apply_chat_template(messages, tokenize=False)
    with pytest.raises(ValueError, match="must alternate"):
        tokenizer.apply_chat_template(messages)


# --- errors -------------------------------------------------------------------


@pytest.fixture(scope="module")
def plain_checkpoint(tmp_path_factory):
    """A checkpoint with the ChatML tokens but no chat template."""
    directory = tmp_path_factory.mktemp("plain")
    chat_models.chat_gpt2(directory, "chatml", template=False)
    return directory


def test_no_template_names_the_preset(plain_checkpoint):
    lm = GPTCausalLM.from_preset(plain_checkpoint)
    assert lm.preprocessor.tokenizer.chat_template is None
    with pytest.raises(ValueError, match="no chat template") as error:
        lm.generate(CONVERSATIONS[0], max_new_tokens=2)
    assert str(plain_checkpoint) in str(error.value)
    # Strings and ids still work; a template set by hand makes messages work.
    assert isinstance(lm.generate("def add(", max_new_tokens=2), str)
    lm.preprocessor.tokenizer.chat_template = chat_models.CHATML_TEMPLATE
    assert isinstance(lm.generate(CONVERSATIONS[0], max_new_tokens=2), str)


# The checks and the sandbox of keras_transformer/tokenizers/chat_template.py, the one implementation: these
# tables run here through the Keras tokenizer and LM, and in tests/export/test_chat_bundle.py through an
# exported bundle's runner (which ships that very file).
MALFORMED_MESSAGES = [
    ({"role": "user", "content": "hi"}, "a single message"),
    ([{"role": "user", "content": "hi"}, "hello"], "message 1 of the conversation"),
    ([{"content": "hi"}], 'string "role"'),
    ([{"role": "user"}], 'needs a "content"'),
    ([{"role": "user", "content": 3}], "content of type int"),
    ([[{"role": "user", "content": "hi"}], []], "conversation 1"),
    ([[{"role": "user", "content": "hi"}], [{"role": "user", "content": "a"}, {"role": 1, "content": "b"}]],
     "message 1 of conversation 1"),
]  # fmt: skip
# (template, the ValueError's message): a template that does not compile, and the sandbox: no underscore
# attributes on namespaces, no mutation of the messages.
BAD_TEMPLATES = [
    ("{% for m in messages %}{{ m.content }", "not valid jinja2"),
    ("{% set ns = namespace(_hidden=1) %}", "underscore"),
    ("{{ messages.append(1) }}", "could not render"),
]


@pytest.mark.parametrize("messages, match", MALFORMED_MESSAGES)
def test_malformed_messages_name_the_entry(checkpoint, messages, match):
    *_, lm = checkpoint
    with pytest.raises(ValueError, match=match):
        lm.generate(messages, max_new_tokens=2)
    with pytest.raises(ValueError, match=match):
        lm.preprocessor.tokenizer.apply_chat_template(messages)


def test_template_errors_are_value_errors(checkpoint):
    style, *_, lm = checkpoint
    tokenizer = lm.preprocessor.tokenizer
    # generate's chat_template_kwargs: a dict, not the variables generate sets, and for messages only.
    for kwargs, match in (
        (["enable_thinking"], "must be None or a dict.*list"),
        ({"add_generation_prompt": False}, r"Received: chat_template_kwargs with \['add_generation_prompt'\]"),
    ):
        with pytest.raises(ValueError, match=match):
            lm.generate(CONVERSATIONS[0], max_new_tokens=2, chat_template_kwargs=kwargs)
    with pytest.raises(ValueError, match="applies to chat messages.*inputs of type str"):
        lm.generate("def add(", max_new_tokens=2, chat_template_kwargs={"enable_thinking": False})
    if style == "llama3":  # the template's own raise_exception
        with pytest.raises(ValueError, match="roles must alternate"):
            lm.generate([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], max_new_tokens=2)
        with pytest.raises(ValueError, match="got tool"):
            tokenizer.apply_chat_template([{"role": "tool", "content": "a"}])
    backup = tokenizer.chat_template
    try:
        for template, match in BAD_TEMPLATES:
            tokenizer.chat_template = template
            with pytest.raises(ValueError, match=match):
                tokenizer.apply_chat_template(CONVERSATIONS[0])
        with pytest.raises(ValueError, match="chat_template of type dict"):
            tokenizer.chat_template = {"default": "x"}
    finally:
        tokenizer.chat_template = backup


def test_in_memory_tokenizer_variables_and_placeholders():
    """A tokenizer built in memory: special tokens are template variables; objects reach it as placeholders."""
    tokenizer = BytePairTokenizer.train(chat_models.hf_models.TEXTS, vocabulary_size=300)
    with pytest.raises(ValueError, match="built in memory"):
        tokenizer.apply_chat_template(CONVERSATIONS[0])
    tokenizer.chat_template = (
        "{{ bos_token }}{% for m in messages %}{{ m.content }}|{% endfor %}{{ messages | tojson }}"
    )
    out = tokenizer.apply_chat_template([{"role": "user", "content": "é", "n": np.int64(3), "x": object()}])
    assert out == '<|endoftext|>é|[{"role": "user", "content": "é", "n": 3, "x": "<object>"}]'


def test_old_jinja2_is_refused(monkeypatch):
    """jinja2 releases before 3.1.6 have known sandbox escapes: rendering refuses them, naming the version."""
    monkeypatch.setattr(jinja2, "__version__", "3.1.5")
    with pytest.raises(ValueError, match=r"jinja2 >= 3\.1\.6.*Received: jinja2 3\.1\.5"):
        chat_template.apply("{{ 'old jinja2' }}", [{"role": "user", "content": "hi"}])
