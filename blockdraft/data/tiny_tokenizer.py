"""A tiny chat tokenizer built offline, for tests and demos that must not touch a hub.

Byte-level BPE with no merges: the 256 byte tokens cover every string, so any text
round-trips, and the vocabulary stays small enough for a debug-sized model.
"""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

EOS_TOKEN = "<|endoftext|>"
# Pad is its own token: a pad that aliases eos would hide the end of every answer.
PAD_TOKEN = "<|pad|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
# Never produced by the template: candidates for the DFlash mask token.
RESERVED_TOKENS = tuple(f"<|reserved_{i}|>" for i in range(8))

# ChatML with the assistant reply (and its end marker) inside a generation block, so
# `return_assistant_tokens_mask=True` marks exactly what the model must learn to write.
# `enable_thinking` is accepted like any template variable and has no effect here.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' -%}"
    "{{ '<|im_start|>assistant\\n' }}"
    "{%- generation -%}"
    "{{ message['content'] }}{{ '<|im_end|>' }}"
    "{%- endgeneration -%}"
    "{{ '\\n' }}"
    "{%- else -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{ '<|im_start|>assistant\\n' }}"
    "{%- endif -%}"
)


def byte_to_symbol() -> dict[int, str]:
    """The printable stand-in the byte-level pre-tokenizer uses for each byte.

    Printable bytes stand for themselves; the others are shifted past 255 in order.
    Token id == byte value follows from building the vocabulary in byte order.
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    symbols: dict[int, str] = {b: chr(b) for b in printable}
    shifted = 0
    for b in range(256):
        if b not in symbols:
            symbols[b] = chr(256 + shifted)
            shifted += 1
    return symbols


def build_tiny_tokenizer() -> PreTrainedTokenizerFast:
    """A ChatML tokenizer of 268 tokens: 256 bytes, then the special tokens."""
    symbols = byte_to_symbol()
    vocab = {symbols[b]: b for b in range(256)}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    specials = [EOS_TOKEN, PAD_TOKEN, IM_START, IM_END, *RESERVED_TOKENS]
    backend.add_special_tokens(specials)
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        additional_special_tokens=[IM_START, IM_END, *RESERVED_TOKENS],
        chat_template=CHAT_TEMPLATE,
        model_max_length=1 << 20,
    )
