//! Media content parts of chat messages, turned into processed items at
//! submit (caller's thread):
//! - `{"type": "image" | "audio", "path": "/file"}`: read from a file;
//! - `{"type": "image" | "audio", "data": "<base64>"}` (a `data:…;base64,`
//!   prefix is accepted): the file's bytes (JPEG/PNG/WebP, or WAV);
//! - `{"type": "input_audio", "input_audio": {"data": "<base64>", "format":
//!   "wav"}}` (OpenAI's form);
//! - `{"type": "image" | "audio", "media": K}`: entry K of the request's
//!   decoded buffers (`RequestOptions::media`, the C ABI's `mlxrt_media`
//!   array).
//!
//! Each becomes `{"type": "image"}` / `{"type": "audio"}` for the chat
//! template. Media the model cannot take is `UNSUPPORTED` naming the part
//! (never a silent text-only answer); undecodable or oversized media is
//! `INVALID_ARGUMENT`.

use super::audio::{decode_wav, Audio};
use super::decode::{decode, Limits, Rgb};
use super::spec::MediaSpec;
use super::{MediaItem, MediaKind};
use crate::{Error, ErrorKind, Result};
use base64::Engine as _;
use serde_json::{json, Value};

/// A decoded media buffer the host passed with the request.
#[derive(Debug, Clone, PartialEq)]
pub enum Buffer {
    Image(Rgb),
    Audio(Audio),
}

impl Buffer {
    fn kind(&self) -> MediaKind {
        match self {
            Buffer::Image(_) => MediaKind::Image,
            Buffer::Audio(_) => MediaKind::Audio,
        }
    }
}

/// The messages as the template sees them, and the processed media in
/// document order.
pub struct Extracted {
    pub messages: Value,
    pub items: Vec<MediaItem>,
}

/// Finds the media parts of `messages`; `None` when there are none (and no
/// buffers were given), so text requests are untouched.
pub fn extract(messages: &Value, spec: Option<&MediaSpec>, buffers: &[Buffer], limits: &Limits) -> Result<Option<Extracted>> {
    let mut out = messages.clone();
    let mut items = vec![];
    let mut used = vec![false; buffers.len()];
    if let Some(list) = out.as_array_mut() {
        for (i, m) in list.iter_mut().enumerate() {
            let Some(parts) = m.get_mut("content").and_then(Value::as_array_mut) else { continue };
            for (j, part) in parts.iter_mut().enumerate() {
                let ty = part.get("type").and_then(Value::as_str).unwrap_or("").to_owned();
                let at = format!("messages[{i}].content[{j}]");
                let kind = match ty.as_str() {
                    "image" => MediaKind::Image,
                    "audio" | "input_audio" => MediaKind::Audio,
                    "video" | "image_url" | "video_url" | "audio_url" => {
                        return Err(Error::unsupported(format!(
                            "{at}: `{ty}` parts are not supported ({{\"type\": \"image\" | \"audio\", \"path\" | \"data\" | \"media\"}})"
                        )));
                    }
                    _ => continue,
                };
                let item = match (kind, spec) {
                    (MediaKind::Image, Some(MediaSpec { image: Some((p, _)), .. })) => {
                        let img = image_source(part, buffers, &mut used, limits).map_err(|e| e.context(&at))?;
                        p.process(&img)
                    }
                    (MediaKind::Audio, Some(MediaSpec { audio: Some((p, _)), .. })) => {
                        let audio = audio_source(part, buffers, &mut used, limits).map_err(|e| e.context(&at))?;
                        p.process(&audio)
                    }
                    (MediaKind::Image, _) => return Err(Error::unsupported(format!("{at}: image input needs a vision tower; this model has none"))),
                    (MediaKind::Audio, _) => return Err(Error::unsupported(format!("{at}: audio input needs an audio tower; this model has none"))),
                };
                items.push(item.map_err(|e| e.context(&at))?);
                *part = json!({"type": kind.name()});
            }
        }
    }
    if let Some(k) = used.iter().position(|u| !u) {
        let kind = buffers[k].kind().name();
        return Err(Error::invalid(format!("media[{k}] is not referenced by any message part ({{\"type\": \"{kind}\", \"media\": {k}}})")));
    }
    Ok((!items.is_empty()).then_some(Extracted { messages: out, items }))
}

/// The bytes of a `path` or `data` source (`None` when the part has
/// neither).
fn file_bytes(part: &Value, what: &str, limits: &Limits) -> Result<Option<Vec<u8>>> {
    if let Some(p) = part.get("path") {
        let p = p.as_str().ok_or_else(|| Error::invalid("`path` must be a string"))?;
        return std::fs::read(p).map(Some).map_err(|e| Error::new(ErrorKind::Io, format!("cannot read {what} {p}: {e}")));
    }
    let Some(d) = part.get("data") else { return Ok(None) };
    let d = d.as_str().ok_or_else(|| Error::invalid("`data` must be a base64 string"))?;
    let d = match d.strip_prefix("data:") {
        Some(rest) => rest.split_once(";base64,").map(|(_, b)| b).ok_or_else(|| Error::invalid("`data` URL is not base64"))?,
        None => d,
    };
    if d.len() / 4 * 3 > limits.max_bytes + 3 {
        return Err(Error::invalid(format!("{what} data is over the limit of {} bytes", limits.max_bytes)));
    }
    let bytes = base64::engine::general_purpose::STANDARD.decode(d.trim()).map_err(|e| Error::invalid(format!("`data` is not valid base64: {e}")))?;
    Ok(Some(bytes))
}

/// Entry `media` of `buffers`, marked used, when the part names one.
fn buffer<'a>(part: &Value, buffers: &'a [Buffer], used: &mut [bool]) -> Result<Option<&'a Buffer>> {
    let Some(k) = part.get("media") else { return Ok(None) };
    let k = k.as_u64().ok_or_else(|| Error::invalid("`media` must be an index into the request's media"))? as usize;
    let b = buffers.get(k).ok_or_else(|| Error::invalid(format!("`media` {k}: the request has {} media entries", buffers.len())))?;
    used[k] = true;
    Ok(Some(b))
}

fn image_source(part: &Value, buffers: &[Buffer], used: &mut [bool], limits: &Limits) -> Result<Rgb> {
    if let Some(bytes) = file_bytes(part, "image", limits)? {
        return decode(&bytes, limits);
    }
    match buffer(part, buffers, used)? {
        Some(Buffer::Image(img)) => Ok(img.clone()),
        Some(Buffer::Audio(_)) => Err(Error::invalid("`media` names an audio entry in an image part")),
        None => Err(Error::invalid("an image part needs `path`, `data` or `media`")),
    }
}

fn audio_source(part: &Value, buffers: &[Buffer], used: &mut [bool], limits: &Limits) -> Result<Audio> {
    if let Some(input) = part.get("input_audio") {
        if let Some(f) = input.get("format").and_then(Value::as_str).filter(|f| !f.eq_ignore_ascii_case("wav")) {
            return Err(Error::unsupported(format!("input_audio format `{f}` is not supported (wav)")));
        }
        let bytes = file_bytes(input, "audio", limits)?.ok_or_else(|| Error::invalid("`input_audio` needs `data`"))?;
        return decode_wav(&bytes, limits);
    }
    if let Some(bytes) = file_bytes(part, "audio", limits)? {
        return decode_wav(&bytes, limits);
    }
    match buffer(part, buffers, used)? {
        Some(Buffer::Audio(a)) => Ok(a.clone()),
        Some(Buffer::Image(_)) => Err(Error::invalid("`media` names an image entry in an audio part")),
        None => Err(Error::invalid("an audio part needs `path`, `data` or `media`")),
    }
}
