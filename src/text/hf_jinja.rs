//! The functions Hugging Face adds to its Jinja environment for chat
//! templates, with the same semantics: `tojson` is Python's `json.dumps`
//! (no HTML escaping, keys in insertion order, `indent=`), `raise_exception`
//! aborts rendering with a message, `strftime_now` formats the current time.
//! `{{ value }}` prints lists, dicts and floats the way Python's `str()` does.

use super::strftime;
use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Error, ErrorKind, Output, State, Value};
use std::fmt::Write;

/// Output of `{{ value }}`: Python's `str(value)` for containers and floats
/// (`[1, 'a']`, `{'k': None}`, `1e+20`); everything else as minijinja prints it.
pub(super) fn formatter(out: &mut Output, state: &State, value: &Value) -> Result<(), Error> {
    let is_float = value.kind() == ValueKind::Number && !value.is_integer();
    if matches!(value.kind(), ValueKind::Seq | ValueKind::Map) || is_float {
        let mut s = String::new();
        python_repr(&mut s, value)?;
        out.write_str(&s).map_err(|e| invalid(e.to_string()))
    } else {
        minijinja::escape_formatter(out, state, value)
    }
}

/// Python's `repr()` of JSON-like data.
fn python_repr(out: &mut String, v: &Value) -> Result<(), Error> {
    match v.kind() {
        ValueKind::None | ValueKind::Undefined => out.push_str("None"),
        ValueKind::Bool => out.push_str(if v.is_true() { "True" } else { "False" }),
        ValueKind::Number if v.is_integer() => out.push_str(&v.to_string()),
        ValueKind::Number => {
            let f = f64::try_from(v.clone())?;
            out.push_str(&match f {
                f if f.is_nan() => "nan".into(),
                f if f.is_infinite() => (if f > 0.0 { "inf" } else { "-inf" }).into(),
                f => python_float(f),
            })
        }
        ValueKind::String => python_str_repr(out, v.as_str().unwrap_or_default()),
        ValueKind::Map => {
            out.push('{');
            for (i, key) in v.try_iter()?.enumerate() {
                out.push_str(if i > 0 { ", " } else { "" });
                python_repr(out, &key)?;
                out.push_str(": ");
                python_repr(out, &v.get_item(&key)?)?;
            }
            out.push('}');
        }
        _ => {
            out.push('[');
            for (i, item) in v.try_iter()?.enumerate() {
                out.push_str(if i > 0 { ", " } else { "" });
                python_repr(out, &item)?;
            }
            out.push(']');
        }
    }
    Ok(())
}

/// `repr(str)`: single quotes unless the text has only `'`s; non-printable
/// chars escaped. Python's non-printable set is Unicode categories C and Z
/// (but ' '); this covers the controls, spaces and format chars seen in text.
fn python_str_repr(out: &mut String, s: &str) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if c.is_control()
                || matches!(c, '\u{a0}' | '\u{ad}' | '\u{1680}' | '\u{2000}'..='\u{200f}' | '\u{2028}'..='\u{202f}'
                    | '\u{205f}'..='\u{2064}' | '\u{3000}' | '\u{feff}') =>
            {
                let n = c as u32;
                let _ = match n {
                    0..=0xff => write!(out, "\\x{n:02x}"),
                    0x100..=0xffff => write!(out, "\\u{n:04x}"),
                    _ => write!(out, "\\U{n:08x}"),
                };
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// `strftime_now(format)`: the current time (UTC, where HF uses local time)
/// formatted like Python's `datetime.strftime`.
pub(super) fn strftime_now(format: &str) -> Result<String, Error> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(|e| invalid(e.to_string()))?;
    strftime::format_utc(now.as_secs() as i64, format).map_err(invalid)
}

/// `raise_exception(message)`: the template rejects its input.
pub(super) fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// `value|tojson(indent=None, sort_keys=False, ensure_ascii=False, separators=None)`.
pub(super) fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match kwargs.get::<Option<Value>>("indent")? {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) if v.is_integer() => Some(" ".repeat(v.as_usize().unwrap_or(0))),
        Some(v) => Some(
            v.as_str()
                .map(String::from)
                .ok_or_else(|| invalid("indent must be an int or str"))?,
        ),
    };
    let (item_sep, key_sep) = match kwargs.get::<Option<Vec<String>>>("separators")? {
        Some(pair) => match <[String; 2]>::try_from(pair) {
            Ok([item, key]) => (item, key),
            Err(_) => return Err(invalid("separators must be an (item, key) pair")),
        },
        // Python's defaults: no space before newlines when indenting.
        None => (
            (if indent.is_some() { "," } else { ", " }).into(),
            ": ".into(),
        ),
    };
    let dumper = Dumper {
        indent,
        item_sep,
        key_sep,
        sort_keys: kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false),
        ensure_ascii: kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false),
    };
    kwargs.assert_all_used()?;
    let mut out = String::new();
    dumper.value(&mut out, value, 0)?;
    Ok(Value::from(out))
}

fn invalid(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::InvalidOperation, msg.into())
}

struct Dumper {
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
    ensure_ascii: bool,
}

impl Dumper {
    fn value(&self, out: &mut String, v: &Value, depth: usize) -> Result<(), Error> {
        match v.kind() {
            ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
            ValueKind::Number if v.is_integer() => {
                write!(out, "{v}").map_err(|e| invalid(e.to_string()))?
            }
            ValueKind::Number => out.push_str(&python_float(f64::try_from(v.clone())?)),
            ValueKind::String => self.string(out, v.as_str().unwrap_or_default()),
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = v.try_iter()?.collect();
                self.container(out, '[', ']', &items, depth, |out, item, d| {
                    self.value(out, item, d)
                })?;
            }
            ValueKind::Map => {
                let mut keys: Vec<Value> = v.try_iter()?.collect();
                if self.sort_keys {
                    keys.sort();
                }
                self.container(out, '{', '}', &keys, depth, |out, key, d| {
                    self.string(out, &key_string(key)?);
                    out.push_str(&self.key_sep);
                    self.value(out, &v.get_item(key)?, d)
                })?;
            }
            kind => {
                return Err(invalid(format!(
                    "tojson: a value of type {kind} is not JSON serializable"
                )))
            }
        }
        Ok(())
    }

    /// Writes `open items close`, one item per line when indenting.
    fn container(
        &self,
        out: &mut String,
        open: char,
        close: char,
        items: &[Value],
        depth: usize,
        mut item: impl FnMut(&mut String, &Value, usize) -> Result<(), Error>,
    ) -> Result<(), Error> {
        out.push(open);
        if items.is_empty() {
            out.push(close);
            return Ok(());
        }
        let newline = |out: &mut String, d: usize| {
            if let Some(ind) = &self.indent {
                out.push('\n');
                (0..d).for_each(|_| out.push_str(ind));
            }
        };
        for (i, it) in items.iter().enumerate() {
            if i > 0 {
                out.push_str(&self.item_sep);
            }
            newline(out, depth + 1);
            item(out, it, depth + 1)?;
        }
        newline(out, depth);
        out.push(close);
        Ok(())
    }

    /// A JSON string as Python writes it: only `"`, `\` and control chars are
    /// escaped (and non-ASCII with `ensure_ascii`).
    fn string(&self, out: &mut String, s: &str) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 || (self.ensure_ascii && !c.is_ascii()) => {
                    let mut units = [0u16; 2];
                    for u in c.encode_utf16(&mut units) {
                        let _ = write!(out, "\\u{u:04x}");
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
}

/// Python turns None/bool/number keys into strings.
fn key_string(key: &Value) -> Result<String, Error> {
    Ok(match key.kind() {
        ValueKind::String => key.as_str().unwrap_or_default().to_string(),
        ValueKind::None => "null".into(),
        ValueKind::Bool => (if key.is_true() { "true" } else { "false" }).into(),
        ValueKind::Number if !key.is_integer() => python_float(f64::try_from(key.clone())?),
        ValueKind::Number => key.to_string(),
        kind => {
            return Err(invalid(format!(
                "tojson: keys must be str, int, float, bool or None, not {kind}"
            )))
        }
    })
}

/// `repr(float)` as `json.dumps` writes it: shortest round-trip digits,
/// positional for exponents in -4..16, else `d.ddde+XX`.
fn python_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    let sci = format!("{f:e}"); // e.g. "-1.5e-7": shortest digits
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if (-4..16).contains(&exp) {
        let s = f.to_string();
        if s.contains('.') {
            s
        } else {
            s + ".0"
        }
    } else {
        format!(
            "{mantissa}e{}{:02}",
            if exp < 0 { '-' } else { '+' },
            exp.abs()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(src: &str, ctx: serde_json::Value) -> Result<String, Error> {
        let mut env = minijinja::Environment::new();
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", raise_exception);
        env.render_str(src, ctx)
    }

    #[test]
    fn tojson_matches_python_json_dumps() {
        // Expected strings are Python's json.dumps output for the same data.
        let data = serde_json::json!({"z": 1, "a": [1.5, 1e20, -2.0, 1e-7, null, true], "s": "<&'\"\\\n\u{1}é🙂"});
        assert_eq!(
            render("{{ d|tojson }}", serde_json::json!({"d": data})).unwrap(),
            r#"{"z": 1, "a": [1.5, 1e+20, -2.0, 1e-07, null, true], "s": "<&'\"\\\n\u0001é🙂"}"#
        );
        assert_eq!(
            render(
                "{{ d|tojson(indent=2) }}",
                serde_json::json!({"d": {"b": [1, {}], "a": []}})
            )
            .unwrap(),
            "{\n  \"b\": [\n    1,\n    {}\n  ],\n  \"a\": []\n}"
        );
        assert_eq!(
            render(
                "{{ d|tojson(sort_keys=true, ensure_ascii=true) }}",
                serde_json::json!({"d": {"b": "é🙂", "a": 0}})
            )
            .unwrap(),
            r#"{"a": 0, "b": "\u00e9\ud83d\ude42"}"#
        );
        assert!(render("{{ 1|tojson(bogus=1) }}", serde_json::json!({})).is_err());
    }

    #[test]
    fn prints_values_like_python_str() {
        let mut env = minijinja::Environment::new();
        env.set_formatter(formatter);
        let ctx = serde_json::json!({"d": {"a": [1, 2.5, null, true, "it's", "q\"'\n\u{a0}é"], "b": {}}, "f": 1e20});
        // Python prints the same data as these strings.
        assert_eq!(
            env.render_str("{{ d }}|{{ f }}|{{ d.a[0] }}|{{ d.a[4] }}|{{ none }}", ctx)
                .unwrap(),
            r#"{'a': [1, 2.5, None, True, "it's", 'q"\'\n\xa0é'], 'b': {}}|1e+20|1|it's|None"#
        );
    }

    #[test]
    fn python_float_repr() {
        for (f, s) in [
            (0.1, "0.1"),
            (100.0, "100.0"),
            (1e16, "1e+16"),
            (1.5e15, "1500000000000000.0"),
            (0.0001, "0.0001"),
            (1.25e-5, "1.25e-05"),
        ] {
            assert_eq!(python_float(f), s);
        }
    }

    #[test]
    fn raise_exception_fails_with_the_message() {
        let err = render(
            "{{ raise_exception('no system role') }}",
            serde_json::json!({}),
        )
        .unwrap_err();
        assert!(err.to_string().contains("no system role"), "{err}");
    }
}
