//! Audio in prompts: WAV files and raw samples into mono f32 (`Audio`), and
//! Gemma 4's feature extractor (`AudioProcessor`: log-mel spectrograms as
//! mlx-vlm's gemma4 `audio_feature_extractor` computes them). Caller's
//! thread, no MLX.

use super::decode::Limits;
use super::{MediaItem, MediaKind};
use crate::{Error, Result};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// Mono samples in -1..1 at `rate` Hz.
#[derive(Debug, Clone, PartialEq)]
pub struct Audio {
    pub samples: Vec<f32>,
    pub rate: u32,
}

/// The longest audio taken, in seconds of samples (30 s are what Gemma 4
/// reads; the cap only bounds memory before the processor truncates).
const MAX_SECONDS: u64 = 600;

fn le16(b: &[u8]) -> u16 {
    u16::from_le_bytes([b[0], b[1]])
}
fn le32(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

/// Decodes a RIFF/WAVE file: PCM 8 (unsigned), 16, 24 or 32-bit integers,
/// or IEEE float 32/64, any number of channels averaged to mono, integers
/// scaled as soundfile reads them (`x / 2^(bits - 1)`).
pub fn decode_wav(bytes: &[u8], limits: &Limits) -> Result<Audio> {
    let bad = |why: &str| Error::invalid(format!("cannot decode the WAV audio: {why}"));
    if bytes.is_empty() {
        return Err(Error::invalid("audio data is empty"));
    }
    if bytes.len() > limits.max_bytes {
        return Err(Error::invalid(format!("audio data is {} bytes, over the limit of {}", bytes.len(), limits.max_bytes)));
    }
    if bytes.len() < 12 || &bytes[..4] != b"RIFF" || &bytes[8..12] != b"WAVE" {
        return Err(Error::invalid("audio data is not a WAV file (RIFF/WAVE)"));
    }
    let (mut fmt, mut data) = (None, None);
    let mut at = 12;
    while at + 8 <= bytes.len() {
        let (id, size) = (&bytes[at..at + 4], le32(&bytes[at + 4..at + 8]) as usize);
        let body = &bytes[at + 8..(at + 8).saturating_add(size).min(bytes.len())];
        match id {
            b"fmt " => fmt = Some(body),
            // A data chunk cut short (a truncated file) keeps what is there.
            b"data" => data = Some(body),
            _ => {}
        }
        at = (at + 8).saturating_add(size).saturating_add(size & 1);
    }
    let fmt = fmt.ok_or_else(|| bad("no fmt chunk"))?;
    let data = data.ok_or_else(|| bad("no data chunk"))?;
    if fmt.len() < 16 {
        return Err(bad("fmt chunk too short"));
    }
    let (mut format, channels, rate, bits) = (le16(&fmt[0..2]), le16(&fmt[2..4]) as usize, le32(&fmt[4..8]), le16(&fmt[14..16]) as usize);
    // WAVE_FORMAT_EXTENSIBLE: the format is the sub-format GUID's first two bytes.
    if format == 0xFFFE {
        if fmt.len() < 26 {
            return Err(bad("extensible fmt chunk too short"));
        }
        format = le16(&fmt[24..26]);
    }
    if channels == 0 || rate == 0 {
        return Err(bad("no channels or a zero sample rate"));
    }
    let width = bits / 8;
    let decode: fn(&[u8]) -> f32 = match (format, bits) {
        (1, 8) => |b| (b[0] as f32 - 128.0) / 128.0,
        (1, 16) => |b| i16::from_le_bytes([b[0], b[1]]) as f32 / 32768.0,
        (1, 24) => |b| (i32::from_le_bytes([0, b[0], b[1], b[2]]) >> 8) as f32 / 8_388_608.0,
        (1, 32) => |b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f32 / 2_147_483_648.0,
        (3, 32) => |b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        (3, 64) => |b| f64::from_le_bytes(b[..8].try_into().expect("8 bytes")) as f32,
        _ => return Err(Error::unsupported(format!("WAV format {format} with {bits}-bit samples is not supported (PCM 8/16/24/32-bit, float 32/64)"))),
    };
    let frame = width * channels;
    let n = data.len() / frame;
    if n == 0 {
        return Err(Error::invalid("the WAV audio has no samples"));
    }
    if n as u64 > rate as u64 * MAX_SECONDS {
        return Err(Error::invalid(format!("the WAV audio is {} s long, over the limit of {MAX_SECONDS} s", n as u64 / rate as u64)));
    }
    let samples = data
        .chunks_exact(frame)
        .map(|f| {
            let sum: f32 = f.chunks_exact(width).map(decode).sum();
            if channels == 1 {
                sum
            } else {
                sum / channels as f32
            }
        })
        .collect();
    Ok(Audio { samples, rate })
}

/// Mono f32 samples from the host (copied), checked.
pub fn from_samples(samples: &[f32], rate: u32, limits: &Limits) -> Result<Audio> {
    if samples.is_empty() {
        return Err(Error::invalid("audio has no samples"));
    }
    if rate == 0 {
        return Err(Error::invalid("audio sample_rate is 0"));
    }
    if samples.len() * 4 > limits.max_bytes || samples.len() as u64 > rate as u64 * MAX_SECONDS {
        return Err(Error::invalid(format!("audio of {} samples is over the limit", samples.len())));
    }
    if samples.iter().any(|s| !s.is_finite()) {
        return Err(Error::invalid("audio samples must be finite"));
    }
    Ok(Audio { samples: samples.to_vec(), rate })
}

/// Gemma 4's audio feature extractor and how many soft tokens a clip takes.
#[derive(Debug, Clone)]
pub struct AudioProcessor {
    rate: u32,
    mel_bins: usize,
    frame_length: usize,
    hop: usize,
    fft_length: usize,
    preemphasis: f64,
    htk_preemphasis: bool,
    input_scale: f64,
    mel_floor: f64,
    per_bin_mean: Option<Vec<f64>>,
    per_bin_stddev: Option<Vec<f64>>,
    max_samples: usize,
    pad_multiple: usize,
    ms_per_token: f64,
    max_tokens: usize,
    /// Periodic Hann window (f32, as numpy computes it).
    window: Vec<f32>,
    /// `[fft_length / 2 + 1, mel_bins]` triangular HTK filters (f64).
    filters: Vec<f64>,
}

impl AudioProcessor {
    /// From processor_config.json's `feature_extractor` (`fe`, mlx-vlm's
    /// defaults for what it omits: 128 mels, 16 kHz, 20 ms frames, 10 ms hop,
    /// 0–8000 Hz, floor 1e-3) and its `audio_seq_length` (750) and
    /// `audio_ms_per_token` (40).
    pub fn gemma4(fe: &Value, proc_config: &Value) -> Result<AudioProcessor> {
        let f = |k: &str, d: f64| fe.get(k).and_then(Value::as_f64).unwrap_or(d);
        let rate = f("sampling_rate", 16000.0) as u32;
        let mel_bins = f("feature_size", 128.0) as usize;
        if !(8000..=96000).contains(&rate) || !(1..=1024).contains(&mel_bins) {
            return Err(Error::model("processor config: feature_extractor sampling_rate or feature_size out of range"));
        }
        if f("dither", 0.0) != 0.0 {
            return Err(Error::unsupported("processor config: feature_extractor dither is not supported"));
        }
        let frame_length = (rate as f64 * f("frame_length_ms", 20.0) / 1000.0).round_ties_even() as usize;
        let hop = (rate as f64 * f("hop_length_ms", 10.0) / 1000.0).round_ties_even() as usize;
        if frame_length < 2 || hop == 0 || frame_length > 1 << 16 {
            return Err(Error::model("processor config: feature_extractor frame or hop length out of range"));
        }
        let mut fft_length = frame_length.next_power_of_two();
        if fe.get("fft_overdrive").and_then(Value::as_bool).unwrap_or(false) {
            fft_length *= 2;
        }
        let list = |k: &str| -> Result<Option<Vec<f64>>> {
            match fe.get(k) {
                None | Some(Value::Null) => Ok(None),
                Some(v) => {
                    let l: Vec<f64> = serde_json::from_value(v.clone()).map_err(|e| Error::model(format!("feature_extractor {k}: {e}")))?;
                    if l.len() != mel_bins {
                        return Err(Error::model(format!("feature_extractor {k} has {} values for {mel_bins} mel bins", l.len())));
                    }
                    Ok(Some(l))
                }
            }
        };
        let window = (0..frame_length)
            .map(|n| {
                let c = (2.0 * std::f32::consts::PI * n as f32 / frame_length as f32).cos();
                0.5 - 0.5 * c
            })
            .collect();
        let filters = mel_filters(fft_length / 2 + 1, mel_bins, f("min_frequency", 0.0), f("max_frequency", 8000.0), rate);
        let num = |k: &str, d: f64| proc_config.get(k).and_then(Value::as_f64).unwrap_or(d);
        Ok(AudioProcessor {
            rate,
            mel_bins,
            frame_length,
            hop,
            fft_length,
            preemphasis: f("preemphasis", 0.0),
            htk_preemphasis: fe.get("preemphasis_htk_flavor").and_then(Value::as_bool).unwrap_or(true),
            input_scale: f("input_scale_factor", 1.0),
            mel_floor: f("mel_floor", 1e-3),
            per_bin_mean: list("per_bin_mean")?,
            per_bin_stddev: list("per_bin_stddev")?,
            max_samples: 480_000,
            pad_multiple: 128,
            ms_per_token: num("audio_ms_per_token", 40.0),
            max_tokens: num("audio_seq_length", 750.0) as usize,
            window,
            filters,
        })
    }

    fn identity(&self) -> String {
        format!(
            "rate={};mels={};frame={};hop={};fft={};pre={};htk={};scale={};floor={};mean={:?};std={:?};max={};pad={}",
            self.rate,
            self.mel_bins,
            self.frame_length,
            self.hop,
            self.fft_length,
            self.preemphasis,
            self.htk_preemphasis,
            self.input_scale,
            self.mel_floor,
            self.per_bin_mean,
            self.per_bin_stddev,
            self.max_samples,
            self.pad_multiple
        )
    }

    /// The clip's log-mel frames `[frames, mel_bins]` (frames past the end of
    /// the samples zero, not counted in `valid`), and its soft tokens:
    /// `⌈duration / ms_per_token⌉`, at most `audio_seq_length`.
    pub fn process(&self, audio: &Audio) -> Result<MediaItem> {
        if audio.rate != self.rate {
            return Err(Error::unsupported(format!(
                "audio is {} Hz; this model's feature extractor takes {} Hz (resample it first)",
                audio.rate, self.rate
            )));
        }
        let duration_ms = audio.samples.len() as f64 / self.rate as f64 * 1000.0;
        let tokens = ((duration_ms / self.ms_per_token).ceil() as usize).min(self.max_tokens);
        let real = audio.samples.len().min(self.max_samples);
        let padded = real.div_ceil(self.pad_multiple) * self.pad_multiple;
        let left = self.frame_length / 2;
        let total = left + padded;
        let span = self.frame_length + 1;
        if total < span || tokens == 0 {
            return Err(Error::invalid(format!("audio of {} samples is too short", audio.samples.len())));
        }
        let frames = (total - span) / self.hop + 1;
        let mut wave = vec![0f32; total];
        for (w, &s) in wave[left..left + real].iter_mut().zip(&audio.samples) {
            *w = if self.input_scale != 1.0 { (s as f64 * self.input_scale) as f32 } else { s };
        }
        let bins = self.fft_length / 2 + 1;
        let mut data = vec![0f32; frames * self.mel_bins];
        let mut valid = 0;
        let mut buf = vec![(0f64, 0f64); self.fft_length];
        for i in 0..frames {
            let end = i * self.hop + span - 1;
            if end >= left + real {
                continue;
            }
            valid += 1;
            let x = &wave[i * self.hop..i * self.hop + span];
            buf.iter_mut().for_each(|b| *b = (0.0, 0.0));
            for n in 0..self.frame_length {
                let v = if self.preemphasis == 0.0 {
                    x[n]
                } else if self.htk_preemphasis {
                    if n == 0 {
                        (x[0] as f64 * (1.0 - self.preemphasis)) as f32
                    } else {
                        (x[n] as f64 - self.preemphasis * x[n - 1] as f64) as f32
                    }
                } else {
                    (x[n + 1] as f64 - self.preemphasis * x[n] as f64) as f32
                };
                buf[n].0 = (v * self.window[n]) as f64;
            }
            fft(&mut buf);
            let row = &mut data[i * self.mel_bins..(i + 1) * self.mel_bins];
            for (m, out) in row.iter_mut().enumerate() {
                let mut acc = 0f64;
                for (k, b) in buf[..bins].iter().enumerate() {
                    acc += (b.0 * b.0 + b.1 * b.1).sqrt() * self.filters[k * self.mel_bins + m];
                }
                let mut v = (acc + self.mel_floor).ln();
                if let Some(mean) = &self.per_bin_mean {
                    v -= mean[m];
                }
                if let Some(std) = &self.per_bin_stddev {
                    v /= std[m];
                }
                *out = v as f32;
            }
        }
        let mut h = Sha256::new();
        h.update(b"mlxrt-audio-v1\0");
        h.update(self.identity().as_bytes());
        h.update(audio.rate.to_le_bytes());
        audio.samples.iter().for_each(|s| h.update(s.to_le_bytes()));
        Ok(MediaItem {
            kind: MediaKind::Audio,
            data,
            shape: vec![frames, self.mel_bins],
            grid: [1, frames, self.mel_bins],
            valid,
            tokens,
            hash: h.finalize().into(),
        })
    }
}

/// transformers' `mel_filter_bank` (HTK scale, no normalization, f64):
/// `[bins, mels]` triangles between mel-spaced frequencies.
fn mel_filters(bins: usize, mels: usize, fmin: f64, fmax: f64, rate: u32) -> Vec<f64> {
    let to_mel = |f: f64| 2595.0 * (1.0 + f / 700.0).log10();
    let to_hz = |m: f64| 700.0 * (10f64.powf(m / 2595.0) - 1.0);
    let linspace = |a: f64, b: f64, n: usize| -> Vec<f64> {
        let step = (b - a) / (n - 1) as f64;
        let mut v: Vec<f64> = (0..n).map(|i| a + i as f64 * step).collect();
        v[n - 1] = b;
        v
    };
    let edges: Vec<f64> = linspace(to_mel(fmin), to_mel(fmax), mels + 2).into_iter().map(to_hz).collect();
    let freqs = linspace(0.0, (rate / 2) as f64, bins);
    let mut out = vec![0f64; bins * mels];
    for (k, &f) in freqs.iter().enumerate() {
        for m in 0..mels {
            let down = (f - edges[m]) / (edges[m + 1] - edges[m]);
            let up = (edges[m + 2] - f) / (edges[m + 2] - edges[m + 1]);
            out[k * mels + m] = down.min(up).max(0.0);
        }
    }
    out
}

/// In-place radix-2 complex FFT (`buf.len()` a power of two) of
/// (re, im) pairs.
fn fft(buf: &mut [(f64, f64)]) {
    let n = buf.len();
    let mut j = 0;
    for i in 1..n {
        let mut bit = n >> 1;
        while j & bit != 0 {
            j ^= bit;
            bit >>= 1;
        }
        j |= bit;
        if i < j {
            buf.swap(i, j);
        }
    }
    let mut len = 2;
    while len <= n {
        let ang = -2.0 * std::f64::consts::PI / len as f64;
        for start in (0..n).step_by(len) {
            for k in 0..len / 2 {
                let (s, c) = (ang * k as f64).sin_cos();
                let (a, b) = (buf[start + k], buf[start + k + len / 2]);
                let t = (b.0 * c - b.1 * s, b.0 * s + b.1 * c);
                buf[start + k] = (a.0 + t.0, a.1 + t.1);
                buf[start + k + len / 2] = (a.0 - t.0, a.1 - t.1);
            }
        }
        len <<= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wav(format: u16, bits: u16, channels: u16, rate: u32, data: &[u8]) -> Vec<u8> {
        let mut v = b"RIFF".to_vec();
        v.extend(((36 + data.len()) as u32).to_le_bytes());
        v.extend(b"WAVEfmt ");
        v.extend(16u32.to_le_bytes());
        v.extend(format.to_le_bytes());
        v.extend(channels.to_le_bytes());
        v.extend(rate.to_le_bytes());
        v.extend((rate * (bits / 8 * channels) as u32).to_le_bytes());
        v.extend((bits / 8 * channels).to_le_bytes());
        v.extend(bits.to_le_bytes());
        v.extend(b"data");
        v.extend((data.len() as u32).to_le_bytes());
        v.extend(data);
        v
    }

    #[test]
    fn decodes_pcm_and_float_and_averages_channels() {
        let l = Limits::default();
        let pcm16: Vec<u8> = [0i16, 16384, -32768, 32767].iter().flat_map(|s| s.to_le_bytes()).collect();
        let a = decode_wav(&wav(1, 16, 1, 16000, &pcm16), &l).unwrap();
        assert_eq!(a.samples, vec![0.0, 0.5, -1.0, 32767.0 / 32768.0]);
        assert_eq!(a.rate, 16000);
        let stereo = decode_wav(&wav(1, 16, 2, 8000, &pcm16), &l).unwrap();
        assert_eq!(stereo.samples, vec![0.25, (-1.0 + 32767.0 / 32768.0) / 2.0]);
        let f32s: Vec<u8> = [0.25f32, -0.75].iter().flat_map(|s| s.to_le_bytes()).collect();
        assert_eq!(decode_wav(&wav(3, 32, 1, 16000, &f32s), &l).unwrap().samples, vec![0.25, -0.75]);
        let pcm24 = [0x00, 0x00, 0x40, 0xff, 0xff, 0xff];
        assert_eq!(decode_wav(&wav(1, 24, 1, 16000, &pcm24), &l).unwrap().samples, vec![0.5, -1.0 / 8_388_608.0]);
    }

    #[test]
    fn hostile_wavs_are_errors() {
        let l = Limits::default();
        let good = wav(1, 16, 1, 16000, &[1, 0, 2, 0]);
        for (what, bytes) in [
            ("empty", vec![]),
            ("not riff", b"hello world, not audio".to_vec()),
            ("header only", good[..12].to_vec()),
            ("no data", good[..36].to_vec()),
            ("zero channels", wav(1, 16, 0, 16000, &[1, 0])),
            ("huge chunk size", { let mut b = good.clone(); b[40..44].copy_from_slice(&u32::MAX.to_le_bytes()); b }),
        ] {
            match decode_wav(&bytes, &l) {
                Err(e) => assert!(matches!(e.kind, crate::ErrorKind::InvalidArgument | crate::ErrorKind::Unsupported), "{what}: {e}"),
                Ok(a) if what == "huge chunk size" => assert_eq!(a.samples.len(), 2, "a cut data chunk keeps what is there"),
                Ok(a) => panic!("{what}: decoded {} samples", a.samples.len()),
            }
        }
        assert_eq!(decode_wav(&wav(2, 16, 1, 16000, &[0, 0]), &l).unwrap_err().kind, crate::ErrorKind::Unsupported, "ADPCM");
    }

    #[test]
    fn fft_matches_a_direct_dft() {
        let x: Vec<f64> = (0..16).map(|i| ((i * 7) % 5) as f64 - 2.0).collect();
        let mut buf: Vec<(f64, f64)> = x.iter().map(|&v| (v, 0.0)).collect();
        fft(&mut buf);
        for (k, b) in buf.iter().enumerate() {
            let (mut re, mut im) = (0.0, 0.0);
            for (n, &v) in x.iter().enumerate() {
                let a = -2.0 * std::f64::consts::PI * (k * n) as f64 / 16.0;
                re += v * a.cos();
                im += v * a.sin();
            }
            assert!((b.0 - re).abs() < 1e-9 && (b.1 - im).abs() < 1e-9, "bin {k}");
        }
    }
}
