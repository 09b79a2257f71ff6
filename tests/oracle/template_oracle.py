#!/usr/bin/env python3
"""Chat template oracle for src/text: renders tests/oracle/template_cases.json
with transformers' own chat-template code (HF's Jinja environment and message
normalization) and prints the results as JSON on stdout: per case either
{"text": ...} or {"error": ...}. Template "gguf" is the model file's own.

usage: template_oracle.py MODEL.gguf
"""
import json
import pathlib
import sys

import mlx.core as mx
from transformers.tokenization_utils_base import _normalize_chat_messages
from transformers.utils.chat_template_utils import render_jinja_template

HERE = pathlib.Path(__file__).parent


def main():
    _, meta = mx.load(sys.argv[1], return_metadata=True)
    templates = {p.stem: p.read_text() for p in (HERE / "templates").glob("*.jinja")}
    templates["gguf"] = meta["tokenizer.chat_template"]
    results = []
    for case in json.loads((HERE / "template_cases.json").read_text()):
        try:
            text = render_jinja_template(
                [_normalize_chat_messages(case["messages"])],
                tools=case.get("tools"),
                chat_template=templates[case["template"]],
                add_generation_prompt=case["add_generation_prompt"],
                **case.get("kwargs", {}),
            )[0][0]
            results.append({"text": text})
        except Exception as e:  # a template's raise_exception, reported like the Rust side
            results.append({"error": str(e)})
    json.dump({"templates": templates, "results": results}, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
