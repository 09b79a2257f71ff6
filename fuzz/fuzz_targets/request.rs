//! What a host hands `mlxrt_request_submit` besides token ids: an options JSON
//! object (`RequestOptions::apply_json`, then `validate`) and chat messages
//! as JSON, rendered by the chat template the way `Engine::prepare` does it
//! (the full conversation with the generation prompt, and the history without
//! it for the prompt cache's boundary).
//!
//! Input: UTF-8 text, `OPTIONS_JSON '\n' MESSAGES_JSON` (the first line is the
//! options). Errors are expected and fine; a panic, a hang or a sanitizer
//! report is a bug.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mlxrt::engine::{Input, RequestOptions};
use mlxrt::text::ChatTemplate;
use serde_json::Value;
use std::sync::OnceLock;

/// SmolLM2-135M-Instruct's template, copied from the GGUF's
/// `tokenizer.chat_template` (the default model's), so the target needs no
/// model file.
const SMOLLM2: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// A ChatML template that also reads tools, tool calls, content parts and a
/// template kwarg, so those paths (`tojson`, Python methods, loops over
/// host-supplied structures) get fuzzed too; shaped after Qwen's.
const TOOLS: &str = r#"{%- if tools %}<|im_start|>system
# Tools
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}<|im_end|>
{% endif %}
{%- for m in messages %}<|im_start|>{{ m.role }}
{%- if m.content is string %}{{ m.content | trim }}
{%- elif m.content is iterable %}{% for p in m.content %}{% if p.type == 'text' %}{{ p.text }}{% endif %}{% endfor %}
{%- endif %}
{%- for call in m.tool_calls | default([]) %}<tool_call>{{ {"name": call.function.name, "arguments": call.function.arguments} | tojson }}</tool_call>{% endfor %}
{%- if m.reasoning_content and enable_thinking | default(true) %}<think>{{ m.reasoning_content.strip() }}</think>{% endif %}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"#;

fn templates() -> &'static [ChatTemplate; 2] {
    static T: OnceLock<[ChatTemplate; 2]> = OnceLock::new();
    T.get_or_init(|| {
        [
            ChatTemplate::new(SMOLLM2, None, Some("<|im_end|>")).expect("SmolLM2 template compiles"),
            ChatTemplate::new(TOOLS, None, None).expect("tools template compiles"),
        ]
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let (options, messages) = text.split_once('\n').unwrap_or((text, "[]"));

    let mut opts = RequestOptions::new(Input::Prompt(String::new()));
    if opts.apply_json(options).is_ok() && opts.validate().is_ok() {
        assert!(opts.max_tokens >= 1);
        assert!(opts.stop.iter().all(|s| !s.is_empty()));
    }

    let Ok(messages) = serde_json::from_str::<Value>(messages) else { return };
    for (i, template) in templates().iter().enumerate() {
        let tools = opts.tools.as_ref();
        let kwargs = opts.template_kwargs.as_ref();
        if let Ok(prompt) = template.render(&messages, tools, true, kwargs) {
            // Every accepted conversation ends in the assistant's turn.
            assert!(prompt.ends_with("<|im_start|>assistant\n"), "template {i}: {prompt:?}");
        }
        if let Some(history) = messages.as_array().filter(|a| a.len() > 1) {
            let head = Value::Array(history[..history.len() - 1].to_vec());
            let _ = template.render(&head, tools, false, kwargs);
        }
    }
});
