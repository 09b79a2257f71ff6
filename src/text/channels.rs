//! Splits generated text into channels: visible content, reasoning (think
//! blocks), and tool calls, for the formats chat templates use:
//! - reasoning between `<think>` and `</think>` (Qwen3, DeepSeek-R1 style);
//!   a prompt that ends inside a think block starts the output in it;
//! - Hermes-style tool calls, `<tool_call>{"name": ..., "arguments": ...}</tool_call>`
//!   (Qwen2/2.5/3 and many fine-tunes);
//! - JSON tool calls, a reply that is one `{"name": ..., "parameters": ...}`
//!   object (Llama 3.x).
//!
//! Text that only might be the start of a tag is withheld until it is not.
//! Nothing is ever dropped: a tool call that does not parse comes out as
//! content.

use serde_json::Value;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    None,
    Hermes,
    Json,
}

/// How to read a model's output, decided from its chat template and prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutputFormat {
    pub tools: ToolFormat,
    /// Parse `<think>` blocks.
    pub think: bool,
    /// The prompt ends inside a think block (the template opened it).
    pub starts_in_think: bool,
}

impl OutputFormat {
    pub const PLAIN: OutputFormat = OutputFormat { tools: ToolFormat::None, think: false, starts_in_think: false };

    /// From the template source, whether tools were given, and the rendered
    /// prompt.
    pub fn detect(template: &str, with_tools: bool, prompt: &str) -> OutputFormat {
        let tools = if !with_tools {
            ToolFormat::None
        } else if template.contains("<tool_call>") {
            ToolFormat::Hermes
        } else if template.contains("<|python_tag|>") || template.contains("\"parameters\"") {
            ToolFormat::Json
        } else {
            ToolFormat::None
        };
        let think = template.contains("<think>");
        let starts_in_think = think && prompt.rfind("<think>").is_some_and(|o| prompt.rfind("</think>").is_none_or(|c| c < o));
        OutputFormat { tools, think, starts_in_think }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    Content(String),
    Reasoning(String),
    /// Name and arguments (a JSON object as text).
    ToolCall { name: String, arguments: String },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Nothing seen yet (a JSON tool call may start here).
    Start,
    Content,
    Reasoning,
    HermesCall,
    JsonCall,
}

const THINK_OPEN: &str = "<think>";
const THINK_CLOSE: &str = "</think>";
const CALL_OPEN: &str = "<tool_call>";
const CALL_CLOSE: &str = "</tool_call>";

pub struct ChannelParser {
    fmt: OutputFormat,
    state: State,
    /// Text not yet given out (a possible tag start, or a tool call body).
    buf: String,
    /// Strip leading newlines of the next piece (right after a tag).
    trim_next: bool,
}

impl ChannelParser {
    pub fn new(fmt: OutputFormat) -> ChannelParser {
        let state = if fmt.starts_in_think { State::Reasoning } else { State::Start };
        ChannelParser { fmt, state, buf: String::new(), trim_next: fmt.starts_in_think }
    }

    /// Tags that switch away from `state`.
    fn tags(&self) -> Vec<&'static str> {
        match self.state {
            State::Start | State::Content => {
                let mut t = vec![];
                if self.fmt.think {
                    t.push(THINK_OPEN);
                }
                if self.fmt.tools == ToolFormat::Hermes {
                    t.push(CALL_OPEN);
                }
                t
            }
            State::Reasoning => vec![THINK_CLOSE],
            State::HermesCall => vec![CALL_CLOSE],
            State::JsonCall => vec![],
        }
    }

    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        self.buf.push_str(text);
        let mut out = vec![];
        loop {
            if self.state == State::Start {
                let t = self.buf.trim_start();
                if t.is_empty() {
                    return out;
                }
                self.state = if self.fmt.tools == ToolFormat::Json && t.starts_with('{') { State::JsonCall } else { State::Content };
            }
            if self.state == State::JsonCall {
                return out; // decided at the end
            }
            let tags = self.tags();
            let found = tags.iter().filter_map(|t| self.buf.find(t).map(|i| (i, *t))).min();
            match found {
                Some((i, tag)) => {
                    let before: String = self.buf.drain(..i).collect();
                    self.buf.drain(..tag.len());
                    self.give(before, &mut out);
                    self.state = match tag {
                        THINK_OPEN => State::Reasoning,
                        CALL_OPEN => State::HermesCall,
                        _ => State::Content,
                    };
                    self.trim_next = true;
                }
                None => {
                    if self.state == State::HermesCall {
                        return out; // the body waits for its closing tag
                    }
                    let keep = tags.iter().map(|t| partial_suffix(&self.buf, t)).max().unwrap_or(0);
                    let cut = self.buf.len() - keep;
                    let ready: String = self.buf.drain(..cut).collect();
                    self.give(ready, &mut out);
                    return out;
                }
            }
        }
    }

    /// Emits `text` in the current channel (a finished tool-call body when
    /// the state was a call).
    fn give(&mut self, mut text: String, out: &mut Vec<Piece>) {
        if self.trim_next && matches!(self.state, State::Content | State::Reasoning) {
            text = text.trim_start_matches(['\n', '\r']).to_string();
            if text.is_empty() {
                return;
            }
            self.trim_next = false;
        }
        match self.state {
            State::HermesCall => out.push(tool_call(&text).unwrap_or_else(|| Piece::Content(format!("{CALL_OPEN}{text}{CALL_CLOSE}")))),
            State::Reasoning if !text.is_empty() => out.push(Piece::Reasoning(text)),
            State::Content | State::Start if !text.is_empty() => out.push(Piece::Content(text)),
            _ => {}
        }
    }

    /// Ends the output: gives out everything withheld.
    pub fn finish(&mut self) -> Vec<Piece> {
        let rest = std::mem::take(&mut self.buf);
        let mut out = vec![];
        match self.state {
            State::JsonCall => out.push(tool_call(&rest).unwrap_or(Piece::Content(rest))),
            State::HermesCall => out.push(tool_call(&rest).unwrap_or_else(|| Piece::Content(format!("{CALL_OPEN}{rest}")))),
            _ => self.give(rest, &mut out),
        }
        out
    }
}

/// Length of the longest suffix of `s` that begins `tag` (a tag that may be
/// completed by later text).
fn partial_suffix(s: &str, tag: &str) -> usize {
    (1..tag.len().min(s.len() + 1))
        .rev()
        .find(|&n| s.is_char_boundary(s.len() - n) && tag.starts_with(&s[s.len() - n..]))
        .unwrap_or(0)
}

/// A tool call from its JSON text: `{"name": ..., "arguments"|"parameters": {...}}`.
fn tool_call(text: &str) -> Option<Piece> {
    let v: Value = serde_json::from_str(text.trim()).ok()?;
    let name = v.get("name")?.as_str()?.to_string();
    let args = v.get("arguments").or_else(|| v.get("parameters")).cloned().unwrap_or(Value::Object(Default::default()));
    // Some models put the arguments in as a JSON string.
    let args = match args {
        Value::String(s) => serde_json::from_str::<Value>(&s).ok().filter(Value::is_object)?,
        Value::Object(_) => args,
        _ => return None,
    };
    Some(Piece::ToolCall { name, arguments: args.to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(fmt: OutputFormat, chunks: &[&str]) -> Vec<Piece> {
        let mut p = ChannelParser::new(fmt);
        let mut out: Vec<Piece> = chunks.iter().flat_map(|c| p.push(c)).collect();
        out.extend(p.finish());
        // Merge neighbouring pieces of one channel for comparison.
        let mut merged: Vec<Piece> = vec![];
        for x in out {
            match (merged.last_mut(), &x) {
                (Some(Piece::Content(a)), Piece::Content(b)) | (Some(Piece::Reasoning(a)), Piece::Reasoning(b)) => a.push_str(b),
                _ => merged.push(x),
            }
        }
        merged
    }

    const QWEN: OutputFormat = OutputFormat { tools: ToolFormat::Hermes, think: true, starts_in_think: false };

    #[test]
    fn think_blocks_and_hermes_calls_split_across_chunks() {
        let out = run(
            QWEN,
            &["<thi", "nk>\nLet me look", " it up.</th", "ink>\n\nSure. <tool", "_call>{\"name\": \"get_weather\", ", "\"arguments\": {\"city\": \"Paris\"}}</tool_call>"],
        );
        assert_eq!(
            out,
            vec![
                Piece::Reasoning("Let me look it up.".into()),
                Piece::Content("Sure. ".into()),
                Piece::ToolCall { name: "get_weather".into(), arguments: r#"{"city":"Paris"}"#.into() },
            ]
        );
    }

    #[test]
    fn plain_text_and_false_alarms_pass_through() {
        assert_eq!(run(QWEN, &["a < b and <t", "able>"]), vec![Piece::Content("a < b and <table>".into())]);
        assert_eq!(run(OutputFormat::PLAIN, &["<think>x</think>"]), vec![Piece::Content("<think>x</think>".into())]);
    }

    #[test]
    fn broken_calls_become_content() {
        let out = run(QWEN, &["<tool_call>{not json}</tool_call>"]);
        assert_eq!(out, vec![Piece::Content("<tool_call>{not json}</tool_call>".into())]);
        let out = run(QWEN, &["<tool_call>{\"name\": \"f\"}"]);
        assert_eq!(out, vec![Piece::ToolCall { name: "f".into(), arguments: "{}".into() }], "unterminated but valid");
    }

    #[test]
    fn prompt_opened_think_and_json_calls() {
        let r1 = OutputFormat { tools: ToolFormat::None, think: true, starts_in_think: true };
        assert_eq!(
            run(r1, &["\nhmm</think>\n\nanswer"]),
            vec![Piece::Reasoning("hmm".into()), Piece::Content("answer".into())]
        );
        let llama = OutputFormat { tools: ToolFormat::Json, think: false, starts_in_think: false };
        assert_eq!(
            run(llama, &[" {\"name\": \"add\", \"parameters\": ", "{\"a\": 1}}"]),
            vec![Piece::ToolCall { name: "add".into(), arguments: r#"{"a":1}"#.into() }]
        );
        assert_eq!(run(llama, &["{oops"]), vec![Piece::Content("{oops".into())]);
        assert_eq!(run(llama, &["Hello {x}"]), vec![Piece::Content("Hello {x}".into())]);
    }

    #[test]
    fn detection_from_templates() {
        let f = OutputFormat::detect("... <tool_call> ... <think>", true, "<|im_start|>assistant\n<think>\n");
        assert_eq!(f, OutputFormat { tools: ToolFormat::Hermes, think: true, starts_in_think: true });
        let f = OutputFormat::detect("... <tool_call> ... <think>", false, "<think>\n\n</think>\n\n");
        assert_eq!(f, OutputFormat { tools: ToolFormat::None, think: true, starts_in_think: false });
        assert_eq!(OutputFormat::detect("{{ messages }}", true, ""), OutputFormat::PLAIN);
    }
}
