import pytest

from blockdraft.data.rows import Reason
from blockdraft.data.tiny_tokenizer import CHAT_TEMPLATE, build_tiny_tokenizer
from blockdraft.data.tokenize import RowRejected, TokenizedRow, tokenize_row
from blockdraft.errors import DataError

CHAT = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "héllo"},
    {"role": "assistant", "content": "hi there"},
    {"role": "user", "content": "again"},
    {"role": "assistant", "content": "ok"},
]

# ChatML without {% generation %}: the mask must come from locating the replies.
PLAIN_CHATML = CHAT_TEMPLATE.replace("{%- generation -%}", "").replace("{%- endgeneration -%}", "")

# A template that, like thinking models' templates, shows an empty think block on the
# last reply only, and in the generation prompt only when thinking is off.
THINKING_CHATML = (
    "{%- for m in messages -%}"
    "{%- if m.role == 'assistant' -%}{{ '<|im_start|>assistant\\n' }}"
    "{%- if loop.last -%}{{ '<think>\\n\\n</think>\\n\\n' }}{%- endif -%}"
    "{{ m.content + '<|im_end|>\\n' }}"
    "{%- else -%}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and not enable_thinking -%}{{ '<think>\\n\\n</think>\\n\\n' }}{%- endif -%}"
    "{%- endif -%}"
)


def tokenizer_with(template):
    tok = build_tiny_tokenizer()
    tok.chat_template = template
    return tok


def supervised_text(tok, result):
    assert isinstance(result, TokenizedRow), result
    return tok.decode([t for t, m in zip(result.input_ids, result.loss_mask) if m])


def test_mask_is_exactly_assistant_content_and_end_marker():
    tok = build_tiny_tokenizer()
    result = tokenize_row(CHAT, tok, seq_length=512)
    assert supervised_text(tok, result) == "hi there<|im_end|>ok<|im_end|>"
    assert len(result.input_ids) == len(result.loss_mask) and not result.truncated


def test_located_replies_match_the_generation_mask():
    with_mask = tokenize_row(CHAT, build_tiny_tokenizer(), 512)
    located = tokenize_row(CHAT, tokenizer_with(PLAIN_CHATML), 512)
    assert located == with_mask


def test_assistant_first_conversation_without_generation_mask():
    tok = tokenizer_with(PLAIN_CHATML)
    chat = [
        {"role": "assistant", "content": "welcome"},
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a"},
    ]
    assert supervised_text(tok, tokenize_row(chat, tok, 512)) == "welcome<|im_end|>a<|im_end|>"


@pytest.mark.parametrize(
    "thinking, expected",
    [
        (False, "hi there<|im_end|>ok<|im_end|>"),  # serving's prompt already holds the think block
        (True, "hi there<|im_end|><think>\n\n</think>\n\nok<|im_end|>"),  # the model writes it
    ],
)
def test_template_that_rewrites_history(thinking, expected):
    tok = tokenizer_with(THINKING_CHATML)
    result = tokenize_row(CHAT, tok, 512, chat_template_kwargs={"enable_thinking": thinking})
    assert supervised_text(tok, result) == expected


def test_tokenizer_without_template_is_refused_with_the_fix():
    tok = tokenizer_with(None)
    with pytest.raises(DataError, match="no chat template.*set tokenizer.chat_template"):
        tokenize_row(CHAT, tok, 512)


def test_row_without_assistant_is_rejected():
    result = tokenize_row(CHAT[:2], build_tiny_tokenizer(), 512)
    assert isinstance(result, RowRejected) and result.reason is Reason.NO_ASSISTANT_TOKENS


def test_overlong_row_is_truncated_or_dropped():
    tok = build_tiny_tokenizer()
    full = tokenize_row(CHAT, tok, 512)
    cut = tokenize_row(CHAT, tok, 48, overlong="truncate")
    assert cut.truncated and cut.input_ids == full.input_ids[:48] and cut.loss_mask == full.loss_mask[:48]
    assert supervised_text(tok, cut) == "hi th"
    dropped = tokenize_row(CHAT, tok, 48, overlong="drop")
    assert isinstance(dropped, RowRejected) and dropped.reason is Reason.OVERLONG_DROPPED


def test_truncation_that_removes_every_assistant_token_is_rejected():
    result = tokenize_row(CHAT, build_tiny_tokenizer(), 10)
    assert isinstance(result, RowRejected) and result.reason is Reason.NO_ASSISTANT_AFTER_TRUNCATION


def test_template_failure_is_a_rejected_row():
    tok = tokenizer_with("{{ raise_exception('only two roles') }}")
    result = tokenize_row(CHAT, tok, 512)
    assert isinstance(result, RowRejected) and result.reason is Reason.TEMPLATE_ERROR
    assert "only two roles" in result.detail


def test_reply_the_template_rewrites_cannot_be_located():
    tok = tokenizer_with(PLAIN_CHATML.replace("message['content'] }}", "message['content'] | upper }}"))
    result = tokenize_row(CHAT, tok, 512)
    assert isinstance(result, RowRejected) and result.reason is Reason.ASSISTANT_NOT_LOCATED
