from transformers import AutoTokenizer

from blockdraft.data.tiny_tokenizer import RESERVED_TOKENS, build_tiny_tokenizer

CHAT = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "héllo 😀"},
    {"role": "assistant", "content": "hi"},
    {"role": "user", "content": "again"},
    {"role": "assistant", "content": "ok"},
]


def test_vocabulary_is_bytes_then_specials():
    tok = build_tiny_tokenizer()
    assert len(tok) == 256 + 4 + len(RESERVED_TOKENS)
    assert tok("A")["input_ids"] == [ord("A")]
    assert tok.eos_token == "<|endoftext|>" and tok.pad_token == "<|pad|>"
    assert tok.pad_token_id != tok.eos_token_id
    ids = [tok.convert_tokens_to_ids(t) for t in RESERVED_TOKENS]
    assert len(set(ids)) == 8 and min(ids) >= 256
    assert tok("<|reserved_3|>")["input_ids"] == [tok.convert_tokens_to_ids("<|reserved_3|>")]


def test_any_text_round_trips():
    tok = build_tiny_tokenizer()
    text = "tabs\tand\nnewlines, ünïcödé, 漢字, emoji 🚀, \x00 control"
    assert tok.decode(tok(text)["input_ids"]) == text


def test_template_marks_assistant_content_and_end_marker():
    tok = build_tiny_tokenizer()
    out = tok.apply_chat_template(CHAT, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    supervised = [t for t, m in zip(out["input_ids"], out["assistant_masks"]) if m]
    assert tok.decode(supervised) == "hi<|im_end|>ok<|im_end|>"


def test_generation_prompt_and_thinking_flag():
    tok = build_tiny_tokenizer()
    prompt = tok.apply_chat_template(CHAT[:2], tokenize=False, add_generation_prompt=True, enable_thinking=False)
    assert prompt == (
        "<|im_start|>system\nbe brief<|im_end|>\n"
        "<|im_start|>user\nhéllo 😀<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_survives_save_and_reload(tmp_path):
    tok = build_tiny_tokenizer()
    tok.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path)
    assert len(again) == len(tok)
    assert (again.eos_token_id, again.pad_token_id) == (tok.eos_token_id, tok.pad_token_id)
    assert again.chat_template == tok.chat_template
    kwargs = dict(tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    a, b = tok.apply_chat_template(CHAT, **kwargs), again.apply_chat_template(CHAT, **kwargs)
    assert a["input_ids"] == b["input_ids"] and a["assistant_masks"] == b["assistant_masks"]
