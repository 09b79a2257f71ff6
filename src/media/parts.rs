//! Media content parts of chat messages, turned into processed images at
//! submit (caller's thread):
//! - `{"type": "image", "path": "/file.jpg"}`: read from a file;
//! - `{"type": "image", "data": "<base64>"}` (a `data:image/…;base64,` prefix
//!   is accepted): the file's bytes;
//! - `{"type": "image", "media": K}`: entry K of the request's decoded pixel
//!   buffers (`RequestOptions::media`, the C ABI's `mlxrt_media` array).
//!
//! Each becomes `{"type": "image"}` for the chat template. Media the model
//! cannot take is `UNSUPPORTED` naming the part (never a silent text-only
//! answer); undecodable or oversized media is `INVALID_ARGUMENT`.

use super::decode::{decode, Limits, Rgb};
use super::process::PixelTensor;
use super::spec::MediaSpec;
use crate::{Error, ErrorKind, Result};
use base64::Engine as _;
use serde_json::{json, Value};

/// The messages as the template sees them, and the processed images in
/// document order.
pub struct Extracted {
    pub messages: Value,
    pub images: Vec<PixelTensor>,
}

/// Finds the media parts of `messages`; `None` when there are none (and no
/// pixel buffers were given), so text requests are untouched.
pub fn extract(messages: &Value, spec: Option<&MediaSpec>, buffers: &[Rgb], limits: &Limits) -> Result<Option<Extracted>> {
    let mut out = messages.clone();
    let mut images = vec![];
    let mut used = vec![false; buffers.len()];
    let mut any = false;
    if let Some(list) = out.as_array_mut() {
        for (i, m) in list.iter_mut().enumerate() {
            let Some(parts) = m.get_mut("content").and_then(Value::as_array_mut) else { continue };
            for (j, part) in parts.iter_mut().enumerate() {
                let kind = part.get("type").and_then(Value::as_str).unwrap_or("").to_owned();
                let at = format!("messages[{i}].content[{j}]");
                match kind.as_str() {
                    "image" => {}
                    "audio" | "input_audio" | "video" | "image_url" | "video_url" => {
                        return Err(Error::unsupported(format!("{at}: `{kind}` parts are not supported (images: {{\"type\": \"image\", \"path\" | \"data\" | \"media\"}})")));
                    }
                    _ => continue,
                }
                any = true;
                let Some(spec) = spec else {
                    return Err(Error::unsupported(format!("{at}: image input needs a vision tower; this model has none")));
                };
                let img = source(part, buffers, &mut used, limits).map_err(|e| e.context(&at))?;
                images.push(spec.processor.process(&img));
                *part = json!({"type": "image"});
            }
        }
    }
    if let Some(k) = used.iter().position(|u| !u) {
        return Err(Error::invalid(format!("media[{k}] is not referenced by any message part ({{\"type\": \"image\", \"media\": {k}}})")));
    }
    Ok(any.then_some(Extracted { messages: out, images }))
}

fn source(part: &Value, buffers: &[Rgb], used: &mut [bool], limits: &Limits) -> Result<Rgb> {
    if let Some(p) = part.get("path") {
        let p = p.as_str().ok_or_else(|| Error::invalid("`path` must be a string"))?;
        let bytes = std::fs::read(p).map_err(|e| Error::new(ErrorKind::Io, format!("cannot read image {p}: {e}")))?;
        return decode(&bytes, limits);
    }
    if let Some(d) = part.get("data") {
        let d = d.as_str().ok_or_else(|| Error::invalid("`data` must be a base64 string"))?;
        let d = match d.strip_prefix("data:") {
            Some(rest) => rest.split_once(";base64,").map(|(_, b)| b).ok_or_else(|| Error::invalid("`data` URL is not base64"))?,
            None => d,
        };
        if d.len() / 4 * 3 > limits.max_bytes + 3 {
            return Err(Error::invalid(format!("image data is over the limit of {} bytes", limits.max_bytes)));
        }
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(d.trim())
            .map_err(|e| Error::invalid(format!("`data` is not valid base64: {e}")))?;
        return decode(&bytes, limits);
    }
    if let Some(k) = part.get("media") {
        let k = k.as_u64().ok_or_else(|| Error::invalid("`media` must be an index into the request's media"))? as usize;
        let img = buffers.get(k).ok_or_else(|| Error::invalid(format!("`media` {k}: the request has {} media entries", buffers.len())))?;
        used[k] = true;
        return Ok(img.clone());
    }
    Err(Error::invalid("an image part needs `path`, `data` or `media`"))
}
