#!/usr/bin/env python3
"""Tokenizer oracle for src/text: builds the Hugging Face equivalent of a GGUF
byte-level BPE vocabulary with the Python `tokenizers` library, independently of
the Rust code, and prints (as JSON on stdout) the ids and decodings of a fixed
list of test strings, including a ChatML prompt rendered by transformers.

usage: tokenizer_oracle.py MODEL.gguf
"""
import json
import sys

import mlx.core as mx
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from transformers.tokenization_utils_base import _normalize_chat_messages
from transformers.utils.chat_template_utils import render_jinja_template

CONTROL = 3  # llama.cpp token type of special (control) tokens

STRINGS = [
    "Hello, world!",
    "12345 and 3.14159, 2024-07-26",
    "   leading spaces and  double  spaces   ",
    "line one\nline two\n\n\nthree\r\n",
    "\t tabs\tand\ttabs ",
    "emoji 🙂👍🏽 and 🇫🇷 flags",
    "中文字符和日本語のテキスト",
    "Accents: café, naïve, Ångström, Œuvre",
    "special <|im_start|>inside<|im_end|> text <|endoftext|>",
    "almost special <|im_start| and <|im_end",
    "def f(x):\n    return x**2  # square\n",
    "",
]

MESSAGES = [{"role": "user", "content": "What is 2+2? Answer in 5 words."}]


def build(meta):
    model, pre = meta["tokenizer.ggml.model"], meta["tokenizer.ggml.pre"]
    assert (model, pre) == ("gpt2", "smollm"), (model, pre)
    tokens = meta["tokenizer.ggml.tokens"]
    types = meta["tokenizer.ggml.token_type"].tolist()
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges))
    # "smollm": every digit alone, then the GPT-2 byte-level regex.
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
    )
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty == CONTROL])
    return tok


def main():
    _, meta = mx.load(sys.argv[1], return_metadata=True)
    tok = build(meta)
    template = meta["tokenizer.chat_template"]
    chat = _normalize_chat_messages(MESSAGES)
    prompt = render_jinja_template([chat], chat_template=template, add_generation_prompt=True)[0][0]
    cases = []
    for text in STRINGS + [prompt]:
        tok.encode_special_tokens = False
        ids = tok.encode(text, add_special_tokens=False).ids
        tok.encode_special_tokens = True
        plain = tok.encode(text, add_special_tokens=False).ids
        cases.append(
            {
                "text": text,
                "ids": ids,
                "plain_ids": plain,
                "decoded": tok.decode(ids, skip_special_tokens=False),
                "decoded_skip": tok.decode(ids, skip_special_tokens=True),
            }
        )
    json.dump({"messages": MESSAGES, "prompt": prompt, "cases": cases}, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
