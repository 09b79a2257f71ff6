//! Constrained tool calls: with `tool_choice` "required" or a named
//! function, the output is one call in the model's tool-call format whose
//! arguments are valid against the tool's JSON schema.

use super::ResponseFormat;
use crate::error::{Error, Result};
use crate::text::ToolFormat;
use serde_json::{json, Value};

/// OpenAI's `tool_choice`.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolChoice {
    /// The model decides (unconstrained).
    Auto,
    /// No constraint either (the template still sees the tools).
    None,
    /// Exactly one call, to any of the tools.
    Required,
    /// Exactly one call, to this tool.
    Named(String),
}

impl ToolChoice {
    /// `"auto"`, `"none"`, `"required"` or `{"type": "function", "function":
    /// {"name": …}}`.
    pub fn from_json(v: &Value) -> Result<ToolChoice> {
        match v {
            Value::Null => Ok(ToolChoice::Auto),
            Value::String(s) => match s.as_str() {
                "auto" => Ok(ToolChoice::Auto),
                "none" => Ok(ToolChoice::None),
                "required" => Ok(ToolChoice::Required),
                other => Err(Error::invalid(format!("tool_choice: unknown value `{other}` (auto, none, required or a function)"))),
            },
            _ => v
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .map(|n| ToolChoice::Named(n.to_owned()))
                .ok_or_else(|| Error::invalid("tool_choice: expected {\"type\": \"function\", \"function\": {\"name\": ...}}")),
        }
    }
}

/// The constraint for a call `choice` asks for, in the tool-call `format`
/// the chat template uses; None when the output stays free.
pub(crate) fn call_format(choice: &ToolChoice, tools: Option<&Value>, format: ToolFormat) -> Result<Option<ResponseFormat>> {
    let bad = |m: &str| Error::invalid(format!("tool_choice: {m}"));
    let name = match choice {
        ToolChoice::Auto | ToolChoice::None => return Ok(None),
        ToolChoice::Required => None,
        ToolChoice::Named(n) => Some(n.as_str()),
    };
    let tools = tools.and_then(Value::as_array).filter(|t| !t.is_empty()).ok_or_else(|| bad("needs `tools`"))?;
    let key = match format {
        ToolFormat::Hermes => "arguments",
        ToolFormat::Json => "parameters",
        ToolFormat::None => return Err(bad("this model's chat template has no tool-call format")),
    };
    let mut calls = vec![];
    for t in tools {
        let f = t.get("function").unwrap_or(t);
        let n = f.get("name").and_then(Value::as_str).ok_or_else(|| bad("every tool needs a `name`"))?;
        if name.is_some_and(|want| want != n) {
            continue;
        }
        let params = f.get("parameters").cloned().unwrap_or_else(|| json!({"type": "object"}));
        calls.push(json!({
            "type": "object",
            "properties": {"name": {"const": n}, key: params},
            "required": ["name", key],
            "additionalProperties": false,
        }));
    }
    if calls.is_empty() {
        return Err(bad(&format!("no tool named `{}`", name.unwrap_or_default())));
    }
    let schema = json!({"anyOf": calls, "x-guidance": {"whitespace_flexible": false}});
    Ok(Some(match format {
        ToolFormat::Hermes => ResponseFormat::Lark(format!("start: \"<tool_call>\\n\" %json {schema} \"\\n</tool_call>\"")),
        _ => ResponseFormat::JsonSchema(schema),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choices_and_call_grammars() {
        let p = |v: Value| ToolChoice::from_json(&v);
        assert_eq!(p(json!("required")).unwrap(), ToolChoice::Required);
        assert_eq!(p(json!({"type": "function", "function": {"name": "f"}})).unwrap(), ToolChoice::Named("f".into()));
        assert!(p(json!("always")).is_err() && p(json!({"type": "function"})).is_err());
        let tools = json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}, {"name": "g"}]);
        assert_eq!(call_format(&ToolChoice::Auto, Some(&tools), ToolFormat::Hermes).unwrap(), None);
        let Some(ResponseFormat::Lark(g)) = call_format(&ToolChoice::Required, Some(&tools), ToolFormat::Hermes).unwrap() else { panic!() };
        assert!(g.starts_with("start: \"<tool_call>\\n\" %json {") && g.contains(r#""const":"g""#), "{g}");
        let Some(ResponseFormat::JsonSchema(s)) = call_format(&ToolChoice::Named("g".into()), Some(&tools), ToolFormat::Json).unwrap() else { panic!() };
        assert_eq!(s["anyOf"].as_array().unwrap().len(), 1);
        assert_eq!(s["anyOf"][0]["required"], json!(["name", "parameters"]));
        for (c, t, f) in [
            (ToolChoice::Named("h".into()), Some(&tools), ToolFormat::Hermes),
            (ToolChoice::Required, None, ToolFormat::Hermes),
            (ToolChoice::Required, Some(&tools), ToolFormat::None),
        ] {
            assert_eq!(call_format(&c, t, f).unwrap_err().kind, crate::ErrorKind::InvalidArgument);
        }
    }
}
