//! Pillow's resampler (`Image.resize` on 8-bit RGB), reimplemented so that
//! pixel tensors equal what the checkpoint's Python processor computes: the
//! filter's support widens by the downscale factor (antialiasing), weights are
//! normalized, then rounded to 22-bit fixed point; a horizontal pass then a
//! vertical pass, each rounded and clipped to u8; a pass whose size does not
//! change is skipped.

/// Resampling filters, numbered as `PIL.Image.Resampling` (and
/// `preprocessor_config.json`'s `resample`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Filter {
    Bilinear,
    Bicubic,
}

impl Filter {
    pub fn from_pil(code: i64) -> Option<Filter> {
        match code {
            2 => Some(Filter::Bilinear),
            3 => Some(Filter::Bicubic),
            _ => None,
        }
    }
    fn support(self) -> f64 {
        match self {
            Filter::Bilinear => 1.0,
            Filter::Bicubic => 2.0,
        }
    }
    fn weight(self, x: f64) -> f64 {
        let x = x.abs();
        match self {
            Filter::Bilinear => (1.0 - x).max(0.0),
            Filter::Bicubic => {
                const A: f64 = -0.5;
                if x < 1.0 {
                    ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
                } else if x < 2.0 {
                    (((x - 5.0) * x + 8.0) * x - 4.0) * A
                } else {
                    0.0
                }
            }
        }
    }
}

const PRECISION_BITS: u32 = 32 - 8 - 2;

/// Per output index: the first input index, and fixed-point weights.
struct Coeffs {
    bounds: Vec<(usize, usize)>,
    ksize: usize,
    weights: Vec<i32>,
}

fn coeffs(in_size: usize, out_size: usize, filter: Filter) -> Coeffs {
    let scale = in_size as f64 / out_size as f64;
    let filterscale = scale.max(1.0);
    let support = filter.support() * filterscale;
    let ksize = support.ceil() as usize * 2 + 1;
    let mut bounds = Vec::with_capacity(out_size);
    let mut weights = vec![0i32; out_size * ksize];
    let mut k = vec![0f64; ksize];
    for xx in 0..out_size {
        let center = (xx as f64 + 0.5) * scale;
        // C's (int) cast truncates toward zero, as Pillow's does.
        let xmin = ((center - support + 0.5) as i64).max(0) as usize;
        let xmax = ((center + support + 0.5) as i64).min(in_size as i64) as usize - xmin;
        let mut ww = 0.0;
        for (x, kx) in k.iter_mut().enumerate().take(xmax) {
            let w = filter.weight((x as f64 + xmin as f64 - center + 0.5) / filterscale);
            *kx = w;
            ww += w;
        }
        for x in 0..xmax {
            let w = if ww != 0.0 { k[x] / ww } else { k[x] };
            let f = w * (1u32 << PRECISION_BITS) as f64;
            weights[xx * ksize + x] = if w < 0.0 { (f - 0.5) as i32 } else { (f + 0.5) as i32 };
        }
        bounds.push((xmin, xmax));
    }
    Coeffs { bounds, ksize, weights }
}

fn clip8(v: i32) -> u8 {
    if v >= (1 << PRECISION_BITS << 8) {
        255
    } else if v <= 0 {
        0
    } else {
        (v >> PRECISION_BITS) as u8
    }
}

/// Resizes packed RGB8 `src` (`w`×`h`) to `ow`×`oh`.
pub fn resize_rgb8(src: &[u8], w: usize, h: usize, ow: usize, oh: usize, filter: Filter) -> Vec<u8> {
    assert_eq!(src.len(), w * h * 3);
    let horizontal = if ow != w {
        let c = coeffs(w, ow, filter);
        let mut out = vec![0u8; ow * h * 3];
        for y in 0..h {
            let row = &src[y * w * 3..(y + 1) * w * 3];
            for (xx, &(xmin, n)) in c.bounds.iter().enumerate() {
                let k = &c.weights[xx * c.ksize..xx * c.ksize + n];
                for ch in 0..3 {
                    let mut ss: i32 = 1 << (PRECISION_BITS - 1);
                    for (x, &kx) in k.iter().enumerate() {
                        ss += row[(xmin + x) * 3 + ch] as i32 * kx;
                    }
                    out[(y * ow + xx) * 3 + ch] = clip8(ss);
                }
            }
        }
        out
    } else {
        src.to_vec()
    };
    if oh == h {
        return horizontal;
    }
    let c = coeffs(h, oh, filter);
    let mut out = vec![0u8; ow * oh * 3];
    for (yy, &(ymin, n)) in c.bounds.iter().enumerate() {
        let k = &c.weights[yy * c.ksize..yy * c.ksize + n];
        for i in 0..ow * 3 {
            let mut ss: i32 = 1 << (PRECISION_BITS - 1);
            for (y, &ky) in k.iter().enumerate() {
                ss += horizontal[(ymin + y) * ow * 3 + i] as i32 * ky;
            }
            out[yy * ow * 3 + i] = clip8(ss);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_size_is_identity() {
        let src: Vec<u8> = (0..5 * 4 * 3).map(|i| (i * 7 % 256) as u8).collect();
        assert_eq!(resize_rgb8(&src, 5, 4, 5, 4, Filter::Bilinear), src);
    }

    #[test]
    fn constant_image_stays_constant() {
        let src = vec![200u8; 37 * 23 * 3];
        for f in [Filter::Bilinear, Filter::Bicubic] {
            assert!(resize_rgb8(&src, 37, 23, 32, 32, f).iter().all(|&v| v == 200));
            assert!(resize_rgb8(&src, 37, 23, 301, 7, f).iter().all(|&v| v == 200));
        }
    }
}
