"""Small random GPT-2 checkpoints whose tokenizers have chat templates, built locally with `transformers`.

Three templates in the style of real ones: ChatML as Qwen2.5 writes it (system default, tools
through `tojson`, tool calls and responses), Llama 3.1's (a `bos_token` first, the date from
`strftime_now`, `namespace`, roles checked with `raise_exception`) and a thinking model's as Qwen3's
works (earlier turns' reasoning dropped, the last turn's kept in a <think> block, split out of the content
with string methods, the last user turn found by a reverse loop over `namespace`, and `enable_thinking`
false opening an empty <think> block). The special tokens they write are added to a small trained
byte-level BPE vocabulary.
"""

import transformers

from keras_transformer.tokenizers import BytePairTokenizer
from tests.convert import hf_models

CHATML_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call functions. Signatures in <tools></tools>:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""

LLAMA3_TEMPLATE = r"""{{- bos_token }}
{%- if not date_string is defined %}
    {%- set date_string = strftime_now("%d %b %Y") %}
{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- set ns = namespace(turns=0) %}
{%- for message in messages %}
    {%- if message['role'] not in ['user', 'assistant'] %}
        {{- raise_exception('Conversation roles must be user or assistant after the system message, got ' + message['role']) }}
    {%- endif %}
    {%- if (message['role'] == 'user') != (ns.turns % 2 == 0) %}
        {{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- set ns.turns = ns.turns + 1 %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"""

# Written here in the manner of Qwen3's template (not a copy of it), for the jinja features such templates use.
THINKING_TEMPLATE = r"""{%- if messages[0].role == 'system' %}
    {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- set ns = namespace(last_user=messages|length - 1, found=false) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if message.role == 'user' and not ns.found and message.content is string %}
        {%- set ns.last_user = index %}
        {%- set ns.found = true %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- set content = message.content if message.content is string else '' %}
    {%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>\n' }}
    {%- elif message.role == 'assistant' %}
        {%- set reasoning = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning = message.reasoning_content %}
        {%- elif '</think>' in content %}
            {%- set reasoning = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
            {%- set content = content.split('</think>')[-1].lstrip('\n') %}
        {%- endif %}
        {%- if loop.index0 > ns.last_user and (loop.last or reasoning) %}
            {{- '<|im_start|>assistant\n<think>\n' + reasoning.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
        {%- else %}
            {{- '<|im_start|>assistant\n' + content }}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}
"""

# name -> (template, declared special tokens, the other added tokens the template writes)
STYLES = {
    "chatml": (CHATML_TEMPLATE, {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}, ["<|im_start|>"]),
    "llama3": (
        LLAMA3_TEMPLATE,
        {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
        ["<|start_header_id|>", "<|end_header_id|>"],
    ),
    "thinking": (
        THINKING_TEMPLATE,
        {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
        ["<|im_start|>", "<think>", "</think>"],
    ),
}

CONVERSATIONS = [
    [{"role": "user", "content": "def add(a, b):"}],
    [
        {"role": "system", "content": "You write small Python functions."},
        {"role": "user", "content": "the quick brown fox"},
        {"role": "assistant", "content": "jumps over the lazy dog"},
        {"role": "user", "content": "a cat sat on the mat, café ☕"},
    ],
    [  # an earlier turn's reasoning (dropped by a thinking template), a final assistant turn with its own
        {"role": "user", "content": "def add(a, b):"},
        {"role": "assistant", "content": "<think>\nadd two numbers\n</think>\n\nreturn a + b"},
        {"role": "user", "content": "and subtract?"},
        {"role": "assistant", "content": "<think>\nthe other way\n</think>\n\nreturn a - b"},
    ],
]


def chat_gpt2(directory, style, seed=0, template=True):
    """A GPT2LMHeadModel checkpoint whose tokenizer has the `style`'s special tokens and (if `template`) its
    chat template; returns the in-memory `transformers` model."""
    chat_template, special_tokens, extra = STYLES[style]
    tokenizer = BytePairTokenizer.train(hf_models.TEXTS, vocabulary_size=300)
    backend = tokenizer.backend_tokenizer
    added = [token for token in [*special_tokens.values(), *extra] if backend.token_to_id(token) is None]
    backend.add_special_tokens(added)
    vocabulary_size = backend.get_vocab_size(with_added_tokens=True)
    bos = backend.token_to_id(special_tokens.get("bos_token", "<|endoftext|>"))
    config = transformers.GPT2Config(
        vocab_size=vocabulary_size,
        n_embd=32,
        n_layer=2,
        n_head=4,
        n_positions=256,
        bos_token_id=bos,
        eos_token_id=backend.token_to_id(special_tokens["eos_token"]),
        attn_implementation="eager",
    )
    model = hf_models.randomize(transformers.GPT2LMHeadModel(config), seed)
    model.save_pretrained(directory, safe_serialization=True)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, **special_tokens)
    if template:
        fast.chat_template = chat_template
    fast.save_pretrained(directory)
    return model


def hf_ids(hf_tokenizer, messages, **options):
    """`transformers`' token ids of the rendered chat (a list of ints, whatever container this version returns)."""
    ids = hf_tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, **options)
    if hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return list(ids)
