//! Tests of the paged attention kernel and the paged write: a row read
//! through a block table is bitwise the contiguous fused kernel's result
//! (same chunks); many rows of random lengths, tables and windows match
//! MLX's attention on each row's gathered keys; the MLX-op fallback
//! matches too; writes land where they should, in place when they can.

use super::fast::Mask;
use super::test_data::{isas, randn, worst_error};
use super::*;

/// A random permutation of 0..n (splitmix-driven Fisher-Yates).
fn shuffled(n: usize, seed: u64) -> Vec<i32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut v: Vec<i32> = (0..n as i32).collect();
    for i in (1..n).rev() {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        v.swap(i, (s % (i as u64 + 1)) as usize);
    }
    v
}

/// A pool of `n` blocks holding each row of `rows` (`[1, H, len, X]`) at
/// the ids of its table; other blocks hold noise.
fn pool_of(rows: &[Array], tables: &[Vec<i32>], n: i32, block: i32, seed: u64) -> Array {
    let (h, x) = (rows[0].dim(1), rows[0].dim(3));
    let mut data = randn(&[n, h, block, x], seed).to_vec_f32().unwrap();
    for (r, table) in rows.iter().zip(tables) {
        let len = r.dim(2);
        let v = r.to_vec_f32().unwrap();
        for hi in 0..h {
            for t in 0..len {
                let id = table[(t / block) as usize];
                let dst = (((id * h + hi) * block + t % block) * x) as usize;
                let src = ((hi * len + t) * x) as usize;
                data[dst..dst + x as usize].copy_from_slice(&v[src..src + x as usize]);
            }
        }
    }
    Array::from_f32(&data, &[n, h, block, x]).unwrap()
}

fn bits(a: &Array) -> Vec<u32> {
    a.to_vec_f32().unwrap().iter().map(|f| f.to_bits()).collect()
}

#[test]
fn one_row_through_a_table_is_bitwise_the_contiguous_kernel() {
    let block = 256;
    // (L, T, causal, window): decode over several blocks, a prefill chunk
    // (transposed keys) ending inside a block, a window, no mask.
    let cases = [(1, 700, true, None), (64, 600, true, None), (1, 513, true, Some(100)), (7, 300, false, None), (33, 1024, true, Some(300))];
    for isa in isas() {
        for (ci, &(l, t, causal, window)) in cases.iter().enumerate() {
            let seed = 100 + ci as u64 * 10;
            let (h, rep, d) = (3, 3, 64);
            let q = randn(&[1, h * rep, l, d], seed);
            let k = randn(&[1, h, t, d], seed + 1).mul_scalar(1.5).unwrap();
            let v = randn(&[1, h, t, d], seed + 2);
            let nb = (t + block - 1) / block;
            let table: Vec<i32> = shuffled(nb as usize + 3, seed)[..nb as usize].to_vec();
            let kp = pool_of(&[k.share()], &[table.clone()], nb + 3, block, seed + 3);
            let vp = pool_of(&[v.share()], &[table.clone()], nb + 3, block, seed + 4);
            let bt = BlockTables::new(&[table], &[t], block).unwrap();
            let paged = paged_sdpa_isa(&q, &kp, &vp, &bt, 0.125, causal, window, isa).unwrap();
            assert_eq!(paged_isa_of(&paged), Some(isa), "paged kernel not taken");
            let mask = if causal { Mask::Causal } else { Mask::None };
            let flat = fused_sdpa_isa(&q, &k, &v, 0.125, mask, window, isa).unwrap();
            assert_eq!(fattn_isa_of(&flat), Some(isa));
            assert_eq!(bits(&paged), bits(&flat), "{isa:?} L={l} T={t} causal={causal} window={window:?}");
        }
    }
}

/// Rows of random lengths (L new queries each), random tables over one
/// shared pool, against MLX's attention on each row's own keys.
fn random_rows(isa: Option<QmmIsa>, block: i32, l: i32, causal: bool, window: Option<i32>, seed: u64) -> f32 {
    let (b, h, rep, d) = (4, 2, 3, 64);
    let mut s = seed;
    let mut lens = Vec::new();
    for _ in 0..b {
        s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        lens.push(l + ((s >> 33) % 700) as i32);
    }
    let need: Vec<i32> = lens.iter().map(|n| (n + block - 1) / block).collect();
    let total: i32 = need.iter().sum();
    let ids = shuffled(total as usize + 5, seed);
    let mut tables = Vec::new();
    let mut at = 0;
    for &n in &need {
        tables.push(ids[at..at + n as usize].to_vec());
        at += n as usize;
    }
    let ks: Vec<Array> = lens.iter().enumerate().map(|(i, &n)| randn(&[1, h, n, d], seed + 10 + i as u64).mul_scalar(1.5).unwrap()).collect();
    let vs: Vec<Array> = lens.iter().enumerate().map(|(i, &n)| randn(&[1, h, n, d], seed + 20 + i as u64)).collect();
    let q = randn(&[b, h * rep, l, d], seed + 30);
    let kp = pool_of(&ks, &tables, total + 5, block, seed + 40);
    let vp = pool_of(&vs, &tables, total + 5, block, seed + 41);
    let bt = BlockTables::new(&tables, &lens, block).unwrap();
    let got = match isa {
        Some(isa) => {
            let o = paged_sdpa_isa(&q, &kp, &vp, &bt, 0.125, causal, window, isa).unwrap();
            assert_eq!(paged_isa_of(&o), Some(isa));
            o
        }
        None => paged_sdpa_stock(&q, &kp, &vp, &bt, 0.125, causal, window).unwrap(),
    };
    let mut worst = 0f32;
    for i in 0..b {
        let qi = q.slice_axis(0, i, i + 1).unwrap();
        let gi = got.slice_axis(0, i, i + 1).unwrap();
        let mask = if causal { Mask::Causal } else { Mask::None };
        let want = sdpa_stock(&qi, &ks[i as usize], &vs[i as usize], 0.125, mask, window).unwrap();
        let mask = if causal { Mask::Causal } else { Mask::None };
        let bound = sdpa_stock(&qi, &ks[i as usize], &vs[i as usize].abs().unwrap(), 0.125, mask, window).unwrap();
        worst = worst.max(worst_error(&gi, &want, &bound));
    }
    worst
}

/// |paged - mlx| / bound (see fattn_tests.rs): both are f32 attention in
/// different orders; a wrong block, length or window edge is ~1e-2.
const TOL: f32 = 1e-5;

#[test]
fn rows_of_random_lengths_and_tables_match_mlx_for_every_isa_and_the_fallback() {
    let mut worst = 0f32;
    let mut kinds: Vec<Option<QmmIsa>> = isas().into_iter().map(Some).collect();
    kinds.push(None);
    for isa in kinds {
        for (i, &(block, l, causal, window)) in
            [(32, 1, true, None), (64, 1, true, Some(77)), (256, 1, false, None), (96, 5, true, None), (128, 20, true, Some(40))].iter().enumerate()
        {
            let err = random_rows(isa, block, l, causal, window, 1000 + i as u64);
            assert!(err <= TOL, "{isa:?} block={block} L={l} causal={causal} window={window:?}: {err:e}");
            worst = worst.max(err);
        }
    }
    eprintln!("worst |paged - mlx| / bound: {worst:e}");
}

#[test]
fn the_check_catches_a_wrong_block() {
    // The last logical block read from another row's block: far outside
    // TOL. (Swapping two whole blocks would not show: attention of one
    // query is the same over any order of its keys.)
    let block = 32;
    let (h, d, t) = (1, 64, 100);
    let k = randn(&[1, h, t, d], 7).mul_scalar(1.5).unwrap();
    let v = randn(&[1, h, t, d], 8);
    let q = randn(&[1, 2, 1, d], 9);
    let table = vec![3, 0, 2, 1];
    let kp = pool_of(&[k.share()], &[table.clone()], 4, block, 10);
    let vp = pool_of(&[v.share()], &[table.clone()], 4, block, 11);
    let bad = BlockTables::new(&[vec![3, 0, 2, 0]], &[t], block).unwrap();
    let got = paged_sdpa(&q, &kp, &vp, &bad, 0.125, true, None).unwrap();
    let want = sdpa_stock(&q, &k, &v, 0.125, Mask::Causal, None).unwrap();
    let bound = sdpa_stock(&q, &k, &v.abs().unwrap(), 0.125, Mask::Causal, None).unwrap();
    assert!(worst_error(&got, &want, &bound) > 100.0 * TOL);
    // Ids outside the pool and tables too short are errors, never reads.
    assert!(BlockTables::new(&[vec![0]], &[t], block).is_err());
    let outside = BlockTables::new(&[vec![0, 1, 2, 9]], &[t], block).unwrap();
    assert!(paged_sdpa(&q, &kp, &vp, &outside, 0.125, true, None).is_err());
    assert!(paged_sdpa_stock(&q, &kp, &vp, &outside, 0.125, true, None).is_err());
}

#[test]
fn writes_land_in_place_when_the_pool_is_not_shared() {
    let (n, h, block, x) = (3, 2, 32, 8);
    let pool = Array::zeros(&[n, h, block, x], Dtype::F32).unwrap().contiguous().unwrap();
    let before = data_address(&pool).unwrap();
    let rows = randn(&[3, x], 5);
    let dest = [0, 77, n * h * block - 1];
    let written = paged_write(&pool, &rows, &dest).unwrap();
    drop(pool);
    assert_eq!(data_address(&written).unwrap(), before, "the write copied the pool");
    let got = written.to_vec_f32().unwrap();
    let r = rows.to_vec_f32().unwrap();
    for (i, &d) in dest.iter().enumerate() {
        assert_eq!(&got[(d * x) as usize..][..x as usize], &r[i * x as usize..][..x as usize]);
    }
    assert_eq!(got.iter().filter(|v| **v != 0.0).count(), r.iter().filter(|v| **v != 0.0).count());
    // MLX's scatter (the path off the CPU) writes the same.
    let pool = Array::zeros(&[n, h, block, x], Dtype::F32).unwrap();
    assert_eq!(paged_write_stock(&pool, &rows, &dest).unwrap().to_vec_f32().unwrap(), got);
    // Another handle held: the write copies, the old pool stays as it was.
    let second = randn(&[1, x], 6);
    let again = paged_write(&written, &second, &[1]).unwrap();
    assert_ne!(data_address(&again).unwrap(), data_address(&written).unwrap());
    assert_eq!(written.to_vec_f32().unwrap(), got);
    assert_eq!(&again.to_vec_f32().unwrap()[x as usize..][..x as usize], &second.to_vec_f32().unwrap()[..]);
    // A fresh (broadcast) pool is written dense; destinations outside are errors.
    let fresh = paged_write(&Array::zeros(&[n, h, block, x], Dtype::F32).unwrap(), &rows, &dest).unwrap();
    assert_eq!(fresh.to_vec_f32().unwrap(), got);
    assert!(paged_write(&written, &second, &[n * h * block]).is_err());
}

// ---- affine-quantized pools ----

/// `pool_of` for any dtype (packed words, scales, biases, TurboQuant's
/// bytes and halves); other blocks hold zeros.
fn pool_bytes(rows: &[Array], tables: &[Vec<i32>], n: i32, block: i32) -> Array {
    let (h, x, dtype) = (rows[0].dim(1), rows[0].dim(3), rows[0].dtype());
    let row = x as usize * rows[0].nbytes() / rows[0].size();
    let mut data = vec![0u8; (n * h * block) as usize * row];
    for (r, table) in rows.iter().zip(tables) {
        let len = r.dim(2);
        let v = r.contiguous().unwrap().to_bytes().unwrap();
        for hi in 0..h {
            for t in 0..len {
                let id = table[(t / block) as usize];
                let dst = ((id * h + hi) * block + t % block) as usize * row;
                let src = (hi * len + t) as usize * row;
                data[dst..dst + row].copy_from_slice(&v[src..src + row]);
            }
        }
    }
    Array::from_bytes(&data, &[n, h, block, x], dtype).unwrap()
}

type Planes = [Array; 3];

fn quantized(x: &Array, bits: i32) -> Planes {
    let (w, s, b) = quantize(x, 64, bits).unwrap();
    [w, s, b]
}

fn pools(rows: &[Planes], tables: &[Vec<i32>], n: i32, block: i32) -> Planes {
    let plane = |i: usize| pool_bytes(&rows.iter().map(|p| p[i].share()).collect::<Vec<_>>(), tables, n, block);
    [plane(0), plane(1), plane(2)]
}

fn refs(p: &Planes) -> [&Array; 3] {
    [&p[0], &p[1], &p[2]]
}

#[test]
fn one_row_of_quantized_blocks_is_bitwise_the_contiguous_kernel() {
    let block = 256;
    for isa in isas() {
        for bits in [4, 8] {
            for (ci, &(l, t)) in [(1, 700), (64, 600), (3, 257)].iter().enumerate() {
                let seed = 500 + ci as u64 * 10 + bits as u64;
                let (h, rep, d) = (2, 3, 64);
                let q = randn(&[1, h * rep, l, d], seed);
                let k = quantized(&randn(&[1, h, t, d], seed + 1).mul_scalar(1.5).unwrap(), bits);
                let v = quantized(&randn(&[1, h, t, d], seed + 2), bits);
                let nb = (t + block - 1) / block;
                let table: Vec<i32> = shuffled(nb as usize + 2, seed)[..nb as usize].to_vec();
                let (kp, vp) = (pools(&[k.clone_planes()], &[table.clone()], nb + 2, block), pools(&[v.clone_planes()], &[table.clone()], nb + 2, block));
                let bt = BlockTables::new(&[table], &[t], block).unwrap();
                let paged = paged_quantized_sdpa_isa(&q, refs(&kp), refs(&vp), &bt, 0.125, true, None, 64, bits, isa).unwrap();
                assert_eq!(paged_quantized_isa_of(&paged), Some(isa), "paged quantized kernel not taken");
                let flat = quantized_sdpa_isa(&q, refs(&k), refs(&v), 0.125, Mask::Causal, 64, bits, isa).unwrap();
                assert_eq!(qsdpa_isa_of(&flat), Some(isa));
                assert_eq!(bits_of(&paged), bits_of(&flat), "{isa:?} bits={bits} L={l} T={t}");
            }
        }
    }
}

fn bits_of(a: &Array) -> Vec<u32> {
    bits(a)
}

trait ClonePlanes {
    fn clone_planes(&self) -> Planes;
}
impl ClonePlanes for Planes {
    fn clone_planes(&self) -> Planes {
        [self[0].share(), self[1].share(), self[2].share()]
    }
}

#[test]
fn quantized_rows_of_random_lengths_match_mlx_for_every_isa_and_the_fallback() {
    use super::test_data::attention_bound;
    let mut worst = 0f32;
    let mut kinds: Vec<Option<QmmIsa>> = isas().into_iter().map(Some).collect();
    kinds.push(None);
    for isa in kinds {
        for (i, &(block, l, bits)) in [(32, 1, 4), (64, 1, 8), (96, 5, 4), (128, 20, 8)].iter().enumerate() {
            let seed = 2000 + i as u64 * 100;
            let (b, h, rep, d) = (3, 2, 2, 64);
            let lens: Vec<i32> = (0..b).map(|r| l + ((seed as i32 * 7 + r * 131) % 500)).collect();
            let need: Vec<i32> = lens.iter().map(|n| (n + block - 1) / block).collect();
            let total: i32 = need.iter().sum();
            let ids = shuffled(total as usize + 3, seed);
            let (mut tables, mut at) = (vec![], 0);
            for &n in &need {
                tables.push(ids[at..at + n as usize].to_vec());
                at += n as usize;
            }
            let kf: Vec<Array> = lens.iter().enumerate().map(|(r, &n)| randn(&[1, h, n, d], seed + r as u64).mul_scalar(1.5).unwrap()).collect();
            let vf: Vec<Array> = lens.iter().enumerate().map(|(r, &n)| randn(&[1, h, n, d], seed + 10 + r as u64)).collect();
            let ks: Vec<Planes> = kf.iter().map(|x| quantized(x, bits)).collect();
            let vs: Vec<Planes> = vf.iter().map(|x| quantized(x, bits)).collect();
            let (kp, vp) = (pools(&ks, &tables, total + 3, block), pools(&vs, &tables, total + 3, block));
            let q = randn(&[b, h * rep, l, d], seed + 50);
            let bt = BlockTables::new(&tables, &lens, block).unwrap();
            let got = match isa {
                Some(isa) => {
                    let o = paged_quantized_sdpa_isa(&q, refs(&kp), refs(&vp), &bt, 0.125, true, None, 64, bits, isa).unwrap();
                    assert_eq!(paged_quantized_isa_of(&o), Some(isa));
                    o
                }
                None => paged_quantized_sdpa_stock(&q, refs(&kp), refs(&vp), &bt, 0.125, true, None, 64, bits).unwrap(),
            };
            for r in 0..b {
                let qi = q.slice_axis(0, r, r + 1).unwrap();
                let gi = got.slice_axis(0, r, r + 1).unwrap();
                let (k, v) = (&ks[r as usize], &vs[r as usize]);
                let want = quantized_sdpa_ops(&qi, refs(k), refs(v), 0.125, Mask::Causal, 64, bits).unwrap();
                let keys = dequantize(&k[0], &k[1], &k[2], 64, bits).unwrap();
                let vals = dequantize(&v[0], &v[1], &v[2], 64, bits).unwrap().abs().unwrap();
                let bound = attention_bound(&qi, &keys, &vals, 0.125, &Mask::Causal);
                let err = worst_error(&gi, &want, &bound);
                assert!(err <= TOL, "{isa:?} block={block} L={l} bits={bits} row {r}: {err:e}");
                worst = worst.max(err);
            }
        }
    }
    eprintln!("worst |paged quantized - mlx| / bound: {worst:e}");
}

// ---- TurboQuant pools, and sliding windows with released blocks ----

use crate::cache::turbo::{Keys, TurboCodec, Values};

/// TurboQuant's five planes of `k`, `v` (`[1, H, T, D]`).
fn turbo_planes(codec: &TurboCodec, k: &Array, v: &Array) -> Vec<Array> {
    codec.encode_ops(k, v).unwrap()
}

/// Random ids for rows of `lens` (blocks of `block`) over a pool of
/// `spare` more blocks than they need: the tables and the pool size.
fn random_tables(lens: &[i32], block: i32, spare: i32, seed: u64) -> (Vec<Vec<i32>>, i32) {
    let need: Vec<i32> = lens.iter().map(|n| (n + block - 1) / block).collect();
    let total: i32 = need.iter().sum();
    let ids = shuffled((total + spare) as usize, seed);
    let (mut tables, mut at) = (vec![], 0);
    for &n in &need {
        tables.push(ids[at..at + n as usize].to_vec());
        at += n as usize;
    }
    (tables, total + spare)
}

/// One pool per plane holding each row's planes at its table's blocks.
fn plane_pools(rows: &[Vec<Array>], tables: &[Vec<i32>], n: i32, block: i32) -> Vec<Array> {
    (0..rows[0].len()).map(|i| pool_bytes(&rows.iter().map(|r| r[i].share()).collect::<Vec<_>>(), tables, n, block)).collect()
}

fn turbo_paged(q: &Array, p: &[Array], t: &BlockTables, codec: &TurboCodec, window: Option<i32>, isa: QmmIsa) -> Array {
    let (kb, vb) = (codec.key_bits(), codec.value_bits());
    let o = paged_turbo_sdpa_isa(q, [&p[0], &p[1], &p[2]], [&p[3], &p[4]], t, codec.book(), kb, vb, 0.125, true, window, isa)
        .unwrap()
        .expect("the paged TurboQuant kernel applies");
    assert_eq!(paged_turbo_isa_of(&o), Some(isa), "paged TurboQuant kernel not taken");
    o
}

/// The fallback: the planes gathered per row, then the codec's MLX ops.
fn turbo_gathered(q: &Array, p: &[Array], t: &BlockTables, codec: &TurboCodec, window: Option<i32>) -> Array {
    let g = PagedGather::new(q, t, true, window).unwrap();
    let keys = Keys { idx: g.plane(&p[0]).unwrap(), scale: g.plane(&p[1]).unwrap(), zero: g.plane(&p[2]).unwrap() };
    let values = Values { idx: g.plane(&p[3]).unwrap(), scale: g.plane(&p[4]).unwrap() };
    codec.attend_ops(q, &keys, &values, 0.125, Mask::Array(g.mask())).unwrap()
}

#[test]
fn one_row_of_turbo_blocks_is_bitwise_the_contiguous_kernel() {
    let block = 256;
    for isa in isas() {
        for (kb, vb) in [(8, 3), (4, 2)] {
            for (ci, &(l, t)) in [(1, 700), (64, 600), (3, 257)].iter().enumerate() {
                let seed = 700 + ci as u64 * 10 + kb as u64;
                let (h, rep, d) = (2, 3, 64);
                let codec = TurboCodec::new(kb, vb, d, d).unwrap();
                let q = randn(&[1, h * rep, l, d], seed);
                let planes = turbo_planes(&codec, &randn(&[1, h, t, d], seed + 1).mul_scalar(1.5).unwrap(), &randn(&[1, h, t, d], seed + 2));
                let (tables, n) = random_tables(&[t], block, 2, seed);
                let pools = plane_pools(&[planes.iter().map(Array::share).collect()], &tables, n, block);
                let bt = BlockTables::new(&tables, &[t], block).unwrap();
                let paged = turbo_paged(&q, &pools, &bt, &codec, None, isa);
                let p = &planes;
                let flat = turbo_sdpa_rotated(&q, [&p[0], &p[1], &p[2]], [&p[3], &p[4]], codec.book(), kb, vb, 0.125, Mask::Causal, isa)
                    .unwrap()
                    .expect("the contiguous kernel applies");
                assert_eq!(tqsdpa_isa_of(&flat), Some(isa));
                assert_eq!(bits(&paged), bits(&flat), "{isa:?} k{kb}v{vb} L={l} T={t}");
            }
        }
    }
}

/// Bool `[1, 1, L, T]`: causal for the last `L` of `T` positions, each
/// query seeing its last `window` keys (None: all).
fn causal_mask(l: i32, t: i32, window: Option<i32>) -> Array {
    let keep: Vec<u8> = (0..l)
        .flat_map(|li| (0..t).map(move |ti| (ti <= t - l + li && window.map_or(true, |w| ti > t - l + li - w)) as u8))
        .collect();
    Array::from_bytes(&keep, &[1, 1, l, t], Dtype::Bool).unwrap()
}

#[test]
fn turbo_rows_of_random_lengths_match_the_ops_for_every_isa_and_the_fallback() {
    use super::test_data::attention_bound;
    let mut worst = 0f32;
    let mut kinds: Vec<Option<QmmIsa>> = isas().into_iter().map(Some).collect();
    kinds.push(None);
    for isa in kinds {
        for (i, &(block, l, kb, vb, window)) in
            [(32, 1, 8, 3, None), (64, 1, 4, 2, Some(90)), (96, 5, 8, 4, None), (128, 20, 3, 3, Some(40))].iter().enumerate()
        {
            let seed = 3000 + i as u64 * 100;
            let (b, h, rep, d) = (3, 2, 2, 64);
            let codec = TurboCodec::new(kb, vb, d, d).unwrap();
            let lens: Vec<i32> = (0..b).map(|r| l + ((seed as i32 * 7 + r * 131) % 500)).collect();
            let (tables, n) = random_tables(&lens, block, 3, seed);
            let rows: Vec<Vec<Array>> = (lens.iter().enumerate())
                .map(|(r, &t)| {
                    let k = randn(&[1, h, t, d], seed + r as u64).mul_scalar(1.5).unwrap();
                    turbo_planes(&codec, &k, &randn(&[1, h, t, d], seed + 10 + r as u64))
                })
                .collect();
            let pools = plane_pools(&rows, &tables, n, block);
            let q = randn(&[b, h * rep, l, d], seed + 50);
            let bt = BlockTables::new(&tables, &lens, block).unwrap();
            let got = match isa {
                Some(isa) => turbo_paged(&q, &pools, &bt, &codec, window, isa),
                None => turbo_gathered(&q, &pools, &bt, &codec, window),
            };
            for r in 0..b {
                let (qi, gi, p, t) = (q.slice_axis(0, r, r + 1).unwrap(), got.slice_axis(0, r, r + 1).unwrap(), &rows[r as usize], lens[r as usize]);
                let keys = Keys { idx: p[0].share(), scale: p[1].share(), zero: p[2].share() };
                let values = Values { idx: p[3].share(), scale: p[4].share() };
                let m = causal_mask(l, t, window);
                let want = codec.attend_ops(&qi, &keys, &values, 0.125, Mask::Array(&m)).unwrap();
                let abs = codec.decode_values_rotated(&values).unwrap().abs().unwrap();
                let bound = attention_bound(&qi, &codec.decode_keys(&keys).unwrap(), &abs, 0.125, &Mask::Array(&m));
                let err = worst_error(&gi, &want, &bound);
                assert!(err <= TOL, "{isa:?} block={block} L={l} k{kb}v{vb} window={window:?} row {r}: {err:e}");
                worst = worst.max(err);
            }
        }
    }
    eprintln!("worst |paged turbo - ops| / bound: {worst:e}");
}

#[test]
fn released_blocks_behind_a_window_are_never_read() {
    // A sliding layer's row of 700 positions, window 100, blocks of 64:
    // the 8 blocks wholly before the first query's window (keys before
    // 700 - L - 99) may be -1. Every kernel (float, affine 4-bit, turbo
    // k8v3) and the fallbacks give the same bits as with the blocks held;
    // a -1 the window needs is refused.
    let (block, t, w, h, rep, d) = (64, 700, 100, 2, 3, 64);
    for l in [1, 40] {
        let q = randn(&[1, h * rep, l, d], 11);
        let (k, v) = (randn(&[1, h, t, d], 12).mul_scalar(1.5).unwrap(), randn(&[1, h, t, d], 13));
        let (tables, n) = random_tables(&[t], block, 1, 14);
        let first = t - l - w + 1;
        let released = |upto: i32| -> BlockTables {
            let table: Vec<i32> = (tables[0].iter().enumerate()).map(|(j, &id)| if (j as i32 + 1) * block <= upto { -1 } else { id }).collect();
            BlockTables::new(&[table], &[t], block).unwrap()
        };
        let (held, gone, too_far) = (BlockTables::new(&tables, &[t], block).unwrap(), released(first), released(first + block));
        assert!((first / block) >= 8, "blocks to release");
        let codec = TurboCodec::new(8, 3, d, d).unwrap();
        let kq = quantized(&k, 4);
        let vq = quantized(&v, 4);
        let fp = plane_pools(&[vec![k.share(), v.share()]], &tables, n, block);
        let ap = plane_pools(&[kq.iter().chain(&vq).map(Array::share).collect()], &tables, n, block);
        let tp = plane_pools(&[turbo_planes(&codec, &k, &v)], &tables, n, block);
        let (fk, fv) = (&fp[0], &fp[1]);
        let aq = |t: &BlockTables, isa: Option<QmmIsa>| {
            let (ks, vs) = ([&ap[0], &ap[1], &ap[2]], [&ap[3], &ap[4], &ap[5]]);
            match isa {
                Some(isa) => paged_quantized_sdpa_isa(&q, ks, vs, t, 0.125, true, Some(w), 64, 4, isa),
                None => paged_quantized_sdpa_stock(&q, ks, vs, t, 0.125, true, Some(w), 64, 4),
            }
        };
        let mut kinds: Vec<Option<QmmIsa>> = isas().into_iter().map(Some).collect();
        kinds.push(None);
        for isa in kinds {
            let float = |t: &BlockTables| match isa {
                Some(isa) => paged_sdpa_isa(&q, fk, fv, t, 0.125, true, Some(w), isa),
                None => paged_sdpa_stock(&q, fk, fv, t, 0.125, true, Some(w)),
            };
            let turbo = |t: &BlockTables| match isa {
                Some(isa) => turbo_paged(&q, &tp, t, &codec, Some(w), isa),
                None => turbo_gathered(&q, &tp, t, &codec, Some(w)),
            };
            let label = format!("{isa:?} L={l}");
            assert_eq!(bits(&float(&gone).unwrap()), bits(&float(&held).unwrap()), "float {label}");
            assert_eq!(bits(&aq(&gone, isa).unwrap()), bits(&aq(&held, isa).unwrap()), "affine {label}");
            assert_eq!(bits(&turbo(&gone)), bits(&turbo(&held)), "turbo {label}");
            assert!(float(&too_far).is_err() && aq(&too_far, isa).is_err(), "{label}: a block the window reads was -1");
        }
        // And the window itself is right: against MLX on the row's own keys.
        let want = sdpa_stock(&q, &k, &v, 0.125, Mask::Causal, Some(w)).unwrap();
        let bound = sdpa_stock(&q, &k, &v.abs().unwrap(), 0.125, Mask::Causal, Some(w)).unwrap();
        let got = paged_sdpa(&q, fk, fv, &gone, 0.125, true, Some(w)).unwrap();
        assert!(worst_error(&got, &want, &bound) <= TOL);
    }
}
