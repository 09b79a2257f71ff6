//! `response_format`: what a request asks its output to be, parsed from the
//! request options and turned into an llguidance grammar.

use crate::error::{Error, Result};
use llguidance::api::TopLevelGrammar;
use serde_json::{json, Value};

/// The shape a request's output must have.
#[derive(Debug, Clone, PartialEq)]
pub enum ResponseFormat {
    /// A JSON document valid against this JSON schema.
    JsonSchema(Value),
    /// Any JSON object.
    JsonObject,
    /// Text matching this regular expression (Rust `regex` syntax), whole.
    Regex(String),
    /// Text in the language of this grammar (llguidance's Lark dialect).
    Lark(String),
}

impl ResponseFormat {
    /// Parses the option's value: `{"type": "json_schema", "json_schema":
    /// {"schema": …}}` (OpenAI's shape) or `{"type": "json_schema", "schema":
    /// …}`, `{"type": "json_object"}`, `{"type": "regex", "pattern": …}`,
    /// `{"type": "grammar", "lark": …}` (or `"type": "lark"`); `{"type":
    /// "text"}` and null mean no constraint (None).
    pub fn from_json(v: &Value) -> Result<Option<ResponseFormat>> {
        let bad = |m: &str| Error::invalid(format!("response_format: {m}"));
        if v.is_null() {
            return Ok(None);
        }
        let obj = v.as_object().ok_or_else(|| bad("must be an object with a `type`"))?;
        let text = |key: &str| -> Result<String> {
            obj.get(key).and_then(Value::as_str).map(str::to_owned).ok_or_else(|| bad(&format!("`{key}` must be a string")))
        };
        match obj.get("type").and_then(Value::as_str) {
            Some("text") => Ok(None),
            Some("json_object") => Ok(Some(ResponseFormat::JsonObject)),
            Some("json_schema") => {
                let schema = obj
                    .get("json_schema")
                    .and_then(|j| j.get("schema"))
                    .or_else(|| obj.get("schema"))
                    .ok_or_else(|| bad("type json_schema needs `json_schema.schema` or `schema`"))?;
                if !(schema.is_object() || schema.is_boolean()) {
                    return Err(bad("the schema must be a JSON object"));
                }
                Ok(Some(ResponseFormat::JsonSchema(schema.clone())))
            }
            Some("regex") => Ok(Some(ResponseFormat::Regex(text("pattern")?))),
            Some("grammar" | "lark") => {
                let key = if obj.contains_key("lark") { "lark" } else { "grammar" };
                Ok(Some(ResponseFormat::Lark(text(key)?)))
            }
            Some(other) => Err(bad(&format!(
                "unknown type `{other}` (known: json_schema, json_object, regex, grammar, text)"
            ))),
            None => Err(bad("`type` must be a string")),
        }
    }

    /// The grammar llguidance compiles. JSON is compact (no whitespace
    /// between tokens) unless the schema says otherwise in its own
    /// `x-guidance` options: a small model left free to indent may spend its
    /// whole budget on whitespace.
    pub(super) fn grammar(&self) -> TopLevelGrammar {
        let compact = |mut schema: Value| {
            if let Value::Object(m) = &mut schema {
                m.entry("x-guidance").or_insert_with(|| json!({"whitespace_flexible": false}));
            }
            TopLevelGrammar::from_json_schema(schema)
        };
        match self {
            ResponseFormat::JsonSchema(s) => compact(s.clone()),
            ResponseFormat::JsonObject => compact(json!({"type": "object"})),
            ResponseFormat::Regex(p) => TopLevelGrammar::from_regex(p),
            ResponseFormat::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_shape() {
        let p = |s: &str| ResponseFormat::from_json(&serde_json::from_str(s).unwrap());
        let schema = json!({"type": "integer"});
        assert_eq!(
            p(r#"{"type":"json_schema","json_schema":{"name":"n","schema":{"type":"integer"}}}"#).unwrap(),
            Some(ResponseFormat::JsonSchema(schema.clone()))
        );
        assert_eq!(p(r#"{"type":"json_schema","schema":{"type":"integer"}}"#).unwrap(), Some(ResponseFormat::JsonSchema(schema)));
        assert_eq!(p(r#"{"type":"json_object"}"#).unwrap(), Some(ResponseFormat::JsonObject));
        assert_eq!(p(r#"{"type":"regex","pattern":"a+"}"#).unwrap(), Some(ResponseFormat::Regex("a+".into())));
        assert_eq!(p(r#"{"type":"grammar","lark":"start: \"x\""}"#).unwrap(), Some(ResponseFormat::Lark("start: \"x\"".into())));
        assert_eq!(p(r#"{"type":"text"}"#).unwrap(), None);
        assert_eq!(p("null").unwrap(), None);
        for bad in [r#"{"type":"xml"}"#, r#"{"type":"regex"}"#, r#"{"type":"json_schema"}"#, r#""json""#, r#"{"type":"json_schema","schema":3}"#] {
            let e = p(bad).unwrap_err();
            assert_eq!(e.kind, crate::ErrorKind::InvalidArgument, "{bad}");
            assert!(e.to_string().contains("response_format"), "{e}");
        }
    }
}
