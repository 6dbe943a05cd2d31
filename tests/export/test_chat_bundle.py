"""The ONNX bundle's runner with chat messages: the template travels in the bundle, renders as
`transformers` renders it, and the replies are the Keras model's (greedy, beam), without Keras."""

import json
import shutil

import jinja2
import pytest
import transformers

from keras_transformer.bundle_runtime import load_bundle_runtime
from keras_transformer.models import GPTCausalLM
from keras_transformer.samplers import BeamSampler
from keras_transformer.tokenizers import chat_template
from tests.export.helpers import FRAMEWORKS, run_python
from tests.tokenizers import chat_models
from tests.tokenizers.chat_models import CONVERSATIONS
from tests.tokenizers.test_chat_template import BAD_TEMPLATES, MALFORMED_MESSAGES

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def chat(tmp_path_factory):
    """{"directory": the Hugging Face checkpoint, "lm": ours, "bundle": its ONNX bundle, "generator"}."""
    directory = tmp_path_factory.mktemp("chatml")
    chat_models.chat_gpt2(directory, "chatml")
    lm = GPTCausalLM.from_preset(directory)
    bundle = lm.export(tmp_path_factory.mktemp("bundle") / "bundle", format="onnx")
    return {
        "directory": directory,
        "lm": lm,
        "bundle": bundle,
        "generator": load_bundle_runtime(bundle).Generator(bundle),
    }


def test_bundle_carries_the_template(chat):
    config = json.loads((chat["bundle"] / "tokenizer_config.json").read_text())
    assert config["chat_template"] == chat_models.CHATML_TEMPLATE
    generator = chat["generator"]
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(chat["directory"])
    for conversation in CONVERSATIONS:
        assert generator.apply_chat_template(conversation, add_generation_prompt=True) == (
            hf_tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
        )
    assert generator.apply_chat_template(CONVERSATIONS[1], tools=[{"name": "f", "description": "é"}]) == (
        hf_tokenizer.apply_chat_template(CONVERSATIONS[1], tools=[{"name": "f", "description": "é"}], tokenize=False)
    )


def test_bundle_replies_match_keras(chat):
    """Greedy and beam replies to one conversation and to a batch of them: the Keras model's."""
    lm, generator = chat["lm"], chat["generator"]
    cases = [  # (runner options, Keras options)
        ({"stop_token_ids": None}, {"stop_token_ids": None}),
        ({"sampler": "beam", "num_beams": 3}, {"sampler": BeamSampler(num_beams=3)}),
        ({}, {}),  # stops at the tokenizer's end token, <|im_end|>
    ]
    for options, keras_options in cases:
        expected = lm.generate(CONVERSATIONS, max_new_tokens=6, **keras_options)
        assert generator.generate(CONVERSATIONS, max_new_tokens=6, **options) == expected
        assert generator.generate(CONVERSATIONS[1], max_new_tokens=6, **options) == expected[1]
    # The prompt ids are the template's text tokenized as written: no start token added.
    rendered = generator.apply_chat_template(CONVERSATIONS[0], add_generation_prompt=True)
    ids = lm.preprocessor.tokenizer.tokenize(rendered)
    new = generator.generate_ids([ids], max_new_tokens=6, stop_token_ids=None)[0]
    assert lm.preprocessor.tokenizer.detokenize(new) == lm.generate(
        CONVERSATIONS[0], max_new_tokens=6, stop_token_ids=None
    )


RUNNER = """
import json, runpy, sys, io, contextlib
bundle = sys.argv[1]
sys.argv = [bundle + "/generate.py", "--chat", "--prompt", "def add(a, b):", "--max-new-tokens", "5"]
out = io.StringIO()
with contextlib.redirect_stdout(out):
    try:
        runpy.run_path(bundle + "/generate.py", run_name="__main__")
    except SystemExit as exit:
        assert not exit.code, exit.code
frameworks = sorted(name for name in %r if name in sys.modules)
print(json.dumps({"text": out.getvalue(), "frameworks": frameworks, "jinja2": "jinja2" in sys.modules}))
""" % (FRAMEWORKS,)


def test_runner_chats_without_a_framework(chat):
    result = run_python(RUNNER, chat["bundle"])
    assert result["frameworks"] == [] and result["jinja2"]
    expected = chat["generator"].generate([[{"role": "user", "content": "def add(a, b):"}]], max_new_tokens=5)
    assert result["text"] == expected[0] + "\n"


def test_bundle_chat_errors(chat, tmp_path):
    generator = chat["generator"]
    with pytest.raises(ValueError, match="message 0 of conversation 1"):
        generator.generate([CONVERSATIONS[0], [{"role": "user"}]])
    with pytest.raises(ValueError, match="wrap the message"):
        generator.generate({"role": "user", "content": "hi"})
    # A bundle whose tokenizer has no template says so, naming the bundle.
    plain = tmp_path / "plain"
    shutil.copytree(chat["bundle"], plain)
    config = json.loads((plain / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (plain / "tokenizer_config.json").write_text(json.dumps(config))
    plain_generator = load_bundle_runtime(plain).Generator(plain)
    with pytest.raises(ValueError, match="no chat template") as error:
        plain_generator.generate(CONVERSATIONS[0], max_new_tokens=2)
    assert str(plain) in str(error.value)
    assert isinstance(plain_generator.generate("def add(", max_new_tokens=2), str)


def test_bundle_ships_the_package_chat_template(chat):
    """One implementation of chat templates: the bundle carries keras_transformer/tokenizers/chat_template.py
    byte for byte (copied at export, not retyped)."""
    package_file = chat_template.__file__
    assert (chat["bundle"] / "chat_template.py").read_bytes() == open(package_file, "rb").read()


@pytest.mark.parametrize("messages, match", MALFORMED_MESSAGES)
def test_bundle_malformed_messages_name_the_entry(chat, messages, match):
    """The message checks of tests/tokenizers/test_chat_template.py, through the bundle's runner."""
    with pytest.raises(ValueError, match=match):
        chat["generator"].generate(messages, max_new_tokens=2)
    with pytest.raises(ValueError, match=match):
        chat["generator"].apply_chat_template(messages)


def test_bundle_template_sandbox_and_jinja2_version(chat, monkeypatch):
    """The sandbox and template errors of tests/tokenizers/test_chat_template.py, through the bundle's runner;
    and an old jinja2 is refused there too."""
    generator = chat["generator"]
    for template, match in BAD_TEMPLATES:
        monkeypatch.setattr(generator, "chat_template", template)
        with pytest.raises(ValueError, match=match):
            generator.apply_chat_template(CONVERSATIONS[0])
    monkeypatch.setattr(generator, "chat_template", "{{ 'old jinja2, in a bundle' }}")
    monkeypatch.setattr(jinja2, "__version__", "3.1.5")
    with pytest.raises(ValueError, match=r"jinja2 >= 3\.1\.6.*Received: jinja2 3\.1\.5"):
        generator.apply_chat_template(CONVERSATIONS[0])
