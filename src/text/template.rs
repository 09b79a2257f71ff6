//! Chat templates: Hugging Face's Jinja templates rendered with minijinja,
//! configured like transformers' environment (trim_blocks, lstrip_blocks, loop
//! controls, Python string/dict methods, `tojson`, `raise_exception`,
//! `strftime_now`) and given the same variables.

use super::{hf_jinja, TextError};
use minijinja::{AutoEscape, Environment};
use serde_json::{Map, Value};

const NAME: &str = "chat_template";
/// Variables the renderer sets itself; `extra` may not override them.
const RESERVED: [&str; 4] = ["messages", "tools", "documents", "add_generation_prompt"];

/// A compiled chat template; cheap to render from many threads at once.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

impl ChatTemplate {
    /// Compiles `source`; `bos_token`/`eos_token` are the texts the template
    /// sees as `bos_token`/`eos_token` (undefined when None, as in HF).
    pub fn new(
        source: &str,
        bos_token: Option<&str>,
        eos_token: Option<&str>,
    ) -> Result<ChatTemplate, TextError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_auto_escape_callback(|_| AutoEscape::None);
        env.set_formatter(hf_jinja::formatter);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", hf_jinja::tojson);
        env.add_function("raise_exception", hf_jinja::raise_exception);
        env.add_function("strftime_now", hf_jinja::strftime_now);
        env.add_template_owned(NAME, source.to_string())
            .map_err(|e| TextError::TemplateSyntax(describe(&e)))?;
        Ok(ChatTemplate {
            env,
            source: source.to_string(),
            bos_token: bos_token.map(String::from),
            eos_token: eos_token.map(String::from),
        })
    }

    /// The Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders a conversation. `messages`: an array of `{role, content, ...}`
    /// objects (content a string, null, or an array of `{type, ...}` parts);
    /// `tools`: an array of tool schemas; `extra`: further template variables
    /// such as `enable_thinking`.
    pub fn render(
        &self,
        messages: &Value,
        tools: Option<&Value>,
        add_generation_prompt: bool,
        extra: Option<&Map<String, Value>>,
    ) -> Result<String, TextError> {
        validate_messages(messages)?;
        if let Some(t) = tools.filter(|t| !t.is_array()) {
            return Err(TextError::InvalidMessages(format!(
                "tools must be an array, not {}",
                type_name(t)
            )));
        }
        let mut ctx = Map::new();
        let tokens = [
            ("bos_token", &self.bos_token),
            ("eos_token", &self.eos_token),
        ];
        for (key, token) in tokens {
            if let Some(t) = token {
                ctx.insert(key.into(), Value::from(t.as_str()));
            }
        }
        for (key, value) in extra.into_iter().flatten() {
            if RESERVED.contains(&key.as_str()) {
                return Err(TextError::InvalidMessages(format!(
                    "extra template variable {key:?} is reserved"
                )));
            }
            ctx.insert(key.clone(), value.clone());
        }
        ctx.insert("messages".into(), hf_messages(messages));
        ctx.insert("tools".into(), tools.cloned().unwrap_or(Value::Null));
        ctx.insert("documents".into(), Value::Null);
        ctx.insert(
            "add_generation_prompt".into(),
            Value::Bool(add_generation_prompt),
        );
        let template = self
            .env
            .get_template(NAME)
            .map_err(|e| TextError::TemplateRender(describe(&e)))?;
        template
            .render(ctx)
            .map_err(|e| TextError::TemplateRender(describe(&e)))
    }
}

/// Reasoning is passed under several names; templates read `reasoning_content`
/// (gpt-oss ones `thinking`). Same order of precedence as transformers.
const REASONING_FIELDS: [&str; 3] = ["reasoning_content", "thinking", "reasoning"];

/// The messages as transformers hands them to templates: keys whose value is
/// null dropped (templates handle a missing key better than None), reasoning
/// copied to `thinking` and `reasoning_content`.
fn hf_messages(messages: &Value) -> Value {
    let list = messages
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_object);
    Value::Array(
        list.map(|m| {
            let mut out: Map<String, Value> = m
                .iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            if let Some(r) = REASONING_FIELDS.iter().find_map(|&k| out.get(k).cloned()) {
                if !out.contains_key("thinking") {
                    out.shift_insert(0, "thinking".into(), r.clone());
                }
                out.shift_remove("reasoning_content");
                out.insert("reasoning_content".into(), r);
            }
            Value::Object(out)
        })
        .collect(),
    )
}

/// The error with its cause chain (minijinja puts the line in the message).
fn describe(e: &minijinja::Error) -> String {
    let mut msg = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        msg.push_str(&format!(": {s}"));
        source = s.source();
    }
    msg
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Message roles a conversation may use: OpenAI's (`developer` is its newer
/// name for `system`, used by gpt-oss templates) and Llama 3's `ipython` for
/// tool results. Anything else is refused rather than handed to a template
/// that would render it as plain text. Documented in include/mlxrt.h
/// (`mlxrt_request_params.messages_json`).
const ROLES: [&str; 6] = ["system", "developer", "user", "assistant", "tool", "ipython"];

fn validate_messages(messages: &Value) -> Result<(), TextError> {
    let bad = |msg: String| Err(TextError::InvalidMessages(msg));
    let Some(list) = messages.as_array() else {
        return bad(format!(
            "messages must be an array, not {}",
            type_name(messages)
        ));
    };
    if list.is_empty() {
        return bad("messages is empty; give at least one message".into());
    }
    for (i, m) in list.iter().enumerate() {
        let Some(m) = m.as_object() else {
            return bad(format!(
                "messages[{i}] must be an object, not {}",
                type_name(m)
            ));
        };
        match m.get("role") {
            Some(Value::String(role)) if ROLES.contains(&role.as_str()) => {}
            Some(Value::String(role)) => {
                return bad(format!(
                    "messages[{i}].role {role:?} is not one of {}",
                    ROLES.join(", ")
                ))
            }
            Some(other) => {
                return bad(format!(
                    "messages[{i}].role must be a string, not {}",
                    type_name(other)
                ))
            }
            None => return bad(format!("messages[{i}] has no role")),
        }
        match m.get("content") {
            None | Some(Value::Null | Value::String(_)) => {}
            Some(Value::Array(parts)) => {
                for (j, part) in parts.iter().enumerate() {
                    if !part.get("type").is_some_and(Value::is_string) {
                        return bad(format!(
                            "messages[{i}].content[{j}] must be an object with a string \"type\""
                        ));
                    }
                }
            }
            Some(other) => {
                return bad(format!(
                    "messages[{i}].content must be a string, null or an array of parts, not {}",
                    type_name(other)
                ))
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    fn user(text: &str) -> Value {
        json!([{"role": "user", "content": text}])
    }

    #[test]
    fn renders_chatml() {
        let t = ChatTemplate::new(CHATML, None, None).unwrap();
        assert_eq!(
            t.render(&user("hi"), None, true, None).unwrap(),
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
        assert_eq!(
            t.render(&user("hi"), None, false, None).unwrap(),
            "<|im_start|>user\nhi<|im_end|>\n"
        );
    }

    #[test]
    fn trims_blocks_like_hf() {
        let src = "{% for m in messages %}\n  {% if m.role == 'user' %}\n[{{ m.content.strip() }}]\n  {% endif %}\n{% endfor %}\n";
        let t = ChatTemplate::new(src, None, None).unwrap();
        assert_eq!(t.render(&user("  x "), None, false, None).unwrap(), "[x]\n");
    }

    #[test]
    fn variables_methods_and_loop_controls() {
        let src = "{{ bos_token }}{% for m in messages %}{% if loop.index0 == 1 %}{% break %}{% endif %}\
                   {{ m.content.split(',')|join('|') }}{% if m.content.startswith('a') %}!{% endif %}{% endfor %}\
                   {% for k, v in meta.items() %} {{ k }}={{ v }}{% endfor %}\
                   {% if enable_thinking is defined and enable_thinking is false %} nothink{% endif %}\
                   {% if tools is none %} notools{% endif %}{{ eos_token is defined }}";
        let t = ChatTemplate::new(src, Some("<s>"), None).unwrap();
        let msgs = json!([{"role": "user", "content": "a,b"}, {"role": "user", "content": "c"}]);
        let mut extra = Map::new();
        extra.insert("meta".into(), json!({"z": 1, "a": 2}));
        extra.insert("enable_thinking".into(), json!(false));
        assert_eq!(
            t.render(&msgs, None, false, Some(&extra)).unwrap(),
            "<s>a|b! z=1 a=2 nothink notoolsFalse"
        );
    }

    #[test]
    fn tools_reach_the_template_as_json() {
        let t = ChatTemplate::new("{% for t in tools %}{{ t|tojson }}{% endfor %}", None, None)
            .unwrap();
        let tools = json!([{"type": "function", "function": {"name": "f", "parameters": {"z": 1, "a": "<b>"}}}]);
        assert_eq!(
            t.render(&user("x"), Some(&tools), false, None).unwrap(),
            r#"{"type": "function", "function": {"name": "f", "parameters": {"z": 1, "a": "<b>"}}}"#
        );
        let err = t
            .render(&user("x"), Some(&json!({})), false, None)
            .unwrap_err();
        assert!(err.to_string().contains("tools must be an array"), "{err}");
    }

    #[test]
    fn errors_are_clear() {
        let err = ChatTemplate::new("{% for m in messages %}", None, None)
            .err()
            .unwrap();
        assert!(matches!(err, TextError::TemplateSyntax(_)), "{err}");
        let t = ChatTemplate::new(
            "{% if messages[0].role != 'system' %}{{ raise_exception('first message must be system') }}{% endif %}",
            None,
            None,
        )
        .unwrap();
        let err = t.render(&user("x"), None, false, None).unwrap_err();
        assert!(
            matches!(&err, TextError::TemplateRender(m) if m.contains("first message must be system")),
            "{err}"
        );
        let bad = |m: Value, want: &str| {
            let err = t.render(&m, None, false, None).unwrap_err().to_string();
            assert!(err.contains(want), "{err} lacks {want}");
        };
        bad(json!({"role": "user"}), "messages must be an array");
        bad(json!(["hi"]), "messages[0] must be an object");
        bad(json!([{"content": "x"}]), "messages[0] has no role");
        bad(json!([{"role": 1}]), "messages[0].role must be a string");
        bad(json!([]), "messages is empty");
        bad(
            json!([{"role": "user", "content": "x"}, {"role": "wizard", "content": "y"}]),
            "messages[1].role \"wizard\" is not one of system, developer, user",
        );
        bad(
            json!([{"role": "user", "content": 5}]),
            "messages[0].content must be",
        );
        bad(
            json!([{"role": "user", "content": [{"text": "x"}]}]),
            "messages[0].content[0]",
        );
        let mut extra = Map::new();
        extra.insert("messages".into(), json!([]));
        let err = t
            .render(&user("x"), None, false, Some(&extra))
            .unwrap_err()
            .to_string();
        assert!(err.contains("\"messages\" is reserved"), "{err}");
    }

    #[test]
    fn every_allowed_role_renders() {
        let t = ChatTemplate::new("{% for m in messages %}{{ m.role }};{% endfor %}", None, None).unwrap();
        let msgs: Vec<Value> = ROLES.iter().map(|r| json!({"role": r, "content": "x"})).collect();
        assert_eq!(
            t.render(&Value::Array(msgs), None, false, None).unwrap(),
            "system;developer;user;assistant;tool;ipython;"
        );
    }

    #[test]
    fn strftime_now_gives_the_current_year() {
        let t = ChatTemplate::new("{{ strftime_now('%Y') }}", None, None).unwrap();
        let year = t.render(&user("x"), None, false, None).unwrap();
        assert!(year.len() == 4 && year.as_str() >= "2025", "{year}");
    }

    #[test]
    fn messages_are_normalized_like_transformers() {
        let t = ChatTemplate::new("{{ messages|tojson }}", None, None).unwrap();
        let msgs =
            json!([{"role": "assistant", "content": null, "reasoning": "r", "tool_calls": null}]);
        assert_eq!(
            t.render(&msgs, None, false, None).unwrap(),
            r#"[{"thinking": "r", "role": "assistant", "reasoning": "r", "reasoning_content": "r"}]"#
        );
    }

    #[test]
    fn is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<ChatTemplate>();
    }
}
