"""The export cases' fixtures (hf_export_cases.py holds the cases): each test module builds the cases it uses once."""

import pytest
import transformers

from tests.convert.hf_export_cases import CASES, CHAT_TEMPLATE, Case


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    """build(name) -> Case: the original checkpoint, ours converted from it, its export and transformers' load of it."""
    built = {}

    def get(name):
        if name not in built:
            make, task_cls, auto = CASES[name]
            source = tmp_path_factory.mktemp(name)
            peer = make(source)
            ours = task_cls.from_preset(source)
            if name == "llama":
                ours.preprocessor.tokenizer.chat_template = CHAT_TEMPLATE
            out = ours.export(tmp_path_factory.mktemp(name + "_hf") / "out", format="huggingface")
            theirs = getattr(transformers, auto).from_pretrained(out, attn_implementation="eager").eval()
            built[name] = Case(source, peer, ours, out, theirs)
        return built[name]

    return get


@pytest.fixture(scope="module", params=list(CASES))
def case(request, build):
    return request.param, build(request.param)
