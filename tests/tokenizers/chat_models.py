"""Small random GPT-2 checkpoints whose tokenizers have chat templates, built locally with `transformers`,
and tokenizers alone holding real models' published chat templates.

Three templates in the style of real ones: ChatML as Qwen2.5 writes it (system default, tools
through `tojson`, tool calls and responses), Llama 3.1's (a `bos_token` first, the date from
`strftime_now`, `namespace`, roles checked with `raise_exception`) and a thinking model's as Qwen3's
works (earlier turns' reasoning dropped, the last turn's kept in a <think> block, split out of the content
with string methods, the last user turn found by a reverse loop over `namespace`, and `enable_thinking`
false opening an empty <think> block). The special tokens they write are added to a small trained
byte-level BPE vocabulary.

PUBLISHED holds three models' own templates, byte for byte (Qwen3-0.6B's, Gemma 3's, Phi-4-mini's; each
one's source is named above it), each with its model's special tokens on the same small vocabulary: the
tests render them and compare text and ids with `transformers` (no model is built for them).
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

# Published templates, byte for byte as the models' tokenizers ship them (data, not code).
# Qwen/Qwen3-0.6B's `chat_template` (tools, <think> blocks, `enable_thinking`): llama.cpp's copy of it,
# models/templates/Qwen-Qwen3-0.6B.jinja (read from the ye-NX/llama.cpp fork of ggml-org/llama.cpp, commit b354d7c).
QWEN3_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set content = message.content %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is defined and message.reasoning_content is not none %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in message.content %}
                {%- set content = message.content.split('</think>')[-1].lstrip('\n') %}
                {%- set reasoning_content = message.content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
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
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}"""

# google/gemma-3-1b-it's `chat_template` (a `bos_token` first, the system message folded into the first user
# turn, "model" for the assistant's role, roles checked with `raise_exception`): the tokenizer_config.json
# value quoted in ShishirPatil/gorilla,
# berkeley-function-call-leaderboard/bfcl_eval/model_handler/local_inference/gemma.py.
GEMMA3_TEMPLATE = r"""{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '

' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '

' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '
' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>
' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model
'}}
{%- endif -%}
"""

# microsoft/Phi-4-mini-instruct's `chat_template` (<|system|>, <|user|>, <|assistant|>, <|end|>, a system
# message's "tools" string between <|tool|> and <|/tool|>, `eos_token` closing a chat without a generation
# prompt): the tokenizer_config.json value quoted in ShishirPatil/gorilla,
# berkeley-function-call-leaderboard/bfcl_eval/model_handler/local_inference/phi.py.
PHI4_MINI_TEMPLATE = r"""{% for message in messages %}{% if message['role'] == 'system' and 'tools' in message and message['tools'] is not none %}{{ '<|' + message['role'] + '|>' + message['content'] + '<|tool|>' + message['tools'] + '<|/tool|>' + '<|end|>' }}{% else %}{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' }}{% else %}{{ eos_token }}{% endif %}"""

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

# The published templates, with their models' special tokens (same layout as STYLES). Rendering and ids only:
# no model is built for them (see `chat_tokenizer`).
PUBLISHED = {
    "qwen3": (
        QWEN3_TEMPLATE,
        {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
        ["<|im_start|>", "<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"],
    ),
    "gemma3": (
        GEMMA3_TEMPLATE,
        {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>"},
        ["<start_of_turn>", "<end_of_turn>", "<start_of_image>"],
    ),
    "phi4_mini": (
        PHI4_MINI_TEMPLATE,
        {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"},
        ["<|system|>", "<|user|>", "<|assistant|>", "<|end|>", "<|tool|>", "<|/tool|>"],
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


def chat_tokenizer(directory, style, template=True):
    """Saves to `directory` a small trained byte-level BPE tokenizer with the `style`'s special tokens (a style of
    STYLES or PUBLISHED) and, if `template`, its chat template; returns (the `tokenizers` backend, the
    `transformers` fast tokenizer)."""
    chat_template, special_tokens, extra = {**STYLES, **PUBLISHED}[style]
    tokenizer = BytePairTokenizer.train(hf_models.TEXTS, vocabulary_size=300)
    backend = tokenizer.backend_tokenizer
    added = [token for token in [*special_tokens.values(), *extra] if backend.token_to_id(token) is None]
    backend.add_special_tokens(list(dict.fromkeys(added)))
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, **special_tokens)
    if template:
        fast.chat_template = chat_template
    fast.save_pretrained(directory)
    return backend, fast


def chat_gpt2(directory, style, seed=0, template=True):
    """A GPT2LMHeadModel checkpoint whose tokenizer has the `style`'s special tokens and (if `template`) its
    chat template; returns the in-memory `transformers` model."""
    special_tokens = STYLES[style][1]
    backend, _ = chat_tokenizer(directory, style, template=template)
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
    return model


def hf_ids(hf_tokenizer, messages, add_generation_prompt=True, **options):
    """`transformers`' token ids of the rendered chat (a list of ints, whatever container this version returns)."""
    ids = hf_tokenizer.apply_chat_template(
        messages, tokenize=True, add_generation_prompt=add_generation_prompt, **options
    )
    if hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return list(ids)
