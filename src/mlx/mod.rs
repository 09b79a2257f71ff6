//! The MLX binding: the only module that touches C++. `sys` is the raw cxx
//! bridge; `Array` and its ops are the safe surface the rest of the crate uses.

mod array;
mod fattn;
mod fattn_sys;
#[cfg(test)]
mod fattn_tests;
mod fused;
mod fused_sys;
#[cfg(test)]
mod fused_tests;
pub mod io;
mod ops;
mod paged;
mod paged_sys;
#[cfg(test)]
mod paged_tests;
mod qmm;
mod qmm_sys;
#[cfg(test)]
mod qmm_tests;
mod qsdpa;
mod qsdpa_sys;
#[cfg(test)]
mod qsdpa_tests;
mod swiglu;
mod swiglu_sys;
#[cfg(test)]
mod swiglu_tests;
#[cfg(test)]
pub(crate) mod test_data;
mod sys;
mod tqenc;
mod tqenc_sys;
#[cfg(test)]
mod tqenc_tests;
mod tqsdpa;
mod tqsdpa_sys;
#[cfg(test)]
mod tqsdpa_tests;

pub use array::{async_eval, eval, Array, Dtype, MlxError, Result};
pub use fattn::{fattn_isa_of, fused_sdpa, fused_sdpa_isa, fused_sdpa_merged, merge_heads, sdpa_stock};
pub use fused::{fused_add_rms_norm, fused_heads, fused_rms_norm, fused_rope, fused_rope_at, is_fused_node, rope_inv_freqs, rope_inv_freqs_of, HeadPart, HeadRope};
pub use paged::{
    data_address, paged_isa_of, paged_quantized_isa_of, paged_quantized_sdpa_isa, paged_quantized_sdpa_stock, paged_sdpa,
    paged_sdpa_isa, paged_sdpa_stock, paged_turbo_isa_of, paged_turbo_sdpa_isa, paged_write, paged_write_stock, BlockTables,
    PagedGather,
};
pub use ops::{conv1d, conv2d, dequantize, fast, gather_mm, gather_qmm, quantize, quantized_matmul, random};
pub use qmm::{
    blas_info, fast_qmm_is_int8, fast_qmm_isa_of, fast_quantized_matmul, fast_quantized_matmul_int8,
    fast_quantized_matmul_isa, fast_quantized_matmul_packed, fast_quantized_matmul_with, int8_gemm_available, pack_panels, packable,
    qmm_threads, unpack_panels, BlasInfo, QmmIsa, INT8_MAX_ROWS_4BIT,
};
pub(crate) use qmm::PACKED_COLS;
pub use qsdpa::{qsdpa_isa_of, quantized_sdpa, quantized_sdpa_isa, quantized_sdpa_ops};
pub use tqenc::{is_tqenc_node, turbo_encode, turbo_unrotate, TurboTables};
pub use tqsdpa::{tqsdpa_isa_of, turbo_sdpa_rotated};
pub use swiglu::{fast_swiglu, fast_swiglu_isa, fast_swiglu_isa_of, fast_swiglu_packed, fast_swiglu_packed_isa};

use sys::ffi;

/// The version of the libmlx this process linked.
pub fn version() -> String {
    ffi::mlx_version().unwrap_or_default()
}

/// Device selection for the calling thread's default stream.
pub mod device {
    use super::*;
    pub fn gpu_available() -> bool {
        ffi::gpu_available().unwrap_or(false)
    }
    pub fn set_default(gpu: bool) -> Result<()> {
        Ok(ffi::set_default_device(gpu)?)
    }
    pub fn default_is_gpu() -> bool {
        ffi::default_device_is_gpu().unwrap_or(false)
    }
}

/// The CPU scheduling of the engine's own thread.
pub mod sched {
    /// Marks the calling thread as batch work for Linux's scheduler
    /// (`SCHED_BATCH`: the same share of the CPU, but a wake-up does not
    /// preempt a running thread; it waits for a free core, a yield or the
    /// next tick). The engine's thread wakes dozens of times per token
    /// (MLX lets it enqueue only ten tasks ahead of the CPU stream), and
    /// where cores are few each wake used to preempt MLX's stream thread in
    /// the middle of a kernel. Returns whether the policy was set; a no-op
    /// elsewhere.
    pub fn batch_policy() -> bool {
        #[cfg(target_os = "linux")]
        {
            #[repr(C)]
            struct SchedParam {
                priority: i32,
            }
            const SCHED_BATCH: i32 = 3;
            extern "C" {
                fn sched_setscheduler(pid: i32, policy: i32, param: *const SchedParam) -> i32;
            }
            // SAFETY: pid 0 names the calling thread; `param` outlives the call.
            unsafe { sched_setscheduler(0, SCHED_BATCH, &SchedParam { priority: 0 }) == 0 }
        }
        #[cfg(not(target_os = "linux"))]
        false
    }
}

/// MLX allocator statistics (bytes). These cannot fail in practice; an
/// error reads as 0 / is ignored.
pub mod memory {
    use super::ffi;
    pub fn active() -> usize {
        ffi::active_memory().unwrap_or(0)
    }
    pub fn peak() -> usize {
        ffi::peak_memory().unwrap_or(0)
    }
    pub fn cache() -> usize {
        ffi::cache_memory().unwrap_or(0)
    }
    pub fn reset_peak() {
        let _ = ffi::reset_peak_memory();
    }
    pub fn clear_cache() {
        let _ = ffi::clear_cache();
    }
    pub fn set_cache_limit(bytes: usize) -> usize {
        ffi::set_cache_limit(bytes).unwrap_or(0)
    }

    /// Hands the C heap's free pages back to the system (glibc keeps what
    /// a load freed in its arenas); a no-op where the C library is not glibc.
    pub fn trim_heap() {
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        {
            extern "C" {
                fn malloc_trim(pad: usize) -> i32;
            }
            // SAFETY: malloc_trim only releases free memory; any thread may call it.
            unsafe {
                malloc_trim(0);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The policy `batch_policy` sets is the calling thread's alone.
    #[cfg(target_os = "linux")]
    #[test]
    fn batch_policy_applies_to_the_calling_thread_only() {
        // Field 41 of /proc/thread-self/stat (after the parenthesised name).
        let policy = || -> i32 {
            let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
            let rest = &stat[stat.rfind(')').unwrap() + 2..];
            rest.split(' ').nth(38).unwrap().parse().unwrap()
        };
        let before = policy();
        let inside = std::thread::spawn(move || {
            assert!(sched::batch_policy(), "sched_setscheduler(SCHED_BATCH) refused");
            policy()
        })
        .join()
        .unwrap();
        assert_eq!(inside, 3, "SCHED_BATCH");
        assert_eq!(policy(), before, "the calling thread's policy only");
    }

    #[test]
    fn add_and_read_back() {
        let a = Array::from_f32(&[1.0, 2.0, 3.0, 4.0], &[2, 2]).unwrap();
        let b = Array::scalar_f32(0.5).unwrap();
        let c = a.add(&b).unwrap();
        assert_eq!(c.shape(), vec![2, 2]);
        assert_eq!(c.to_vec_f32().unwrap(), vec![1.5, 2.5, 3.5, 4.5]);
    }

    #[test]
    fn mlx_exceptions_become_errors() {
        let a = Array::from_f32(&[1.0, 2.0, 3.0], &[3]).unwrap();
        let b = Array::from_f32(&[1.0, 2.0], &[2]).unwrap();
        let err = a.add(&b).unwrap_err();
        assert!(err.0.contains("broadcast"), "{err}");
        assert!(Array::from_f32(&[1.0], &[2]).is_err());
        assert!(a.reshape(&[2, 2]).is_err());
    }

    #[test]
    fn bytes_round_trip_through_dtypes() {
        let v: Vec<u8> = [1.0f32, -2.0].iter().flat_map(|x| x.to_le_bytes()).collect();
        let a = Array::from_bytes(&v, &[2], Dtype::F32).unwrap();
        assert_eq!(a.to_vec_f32().unwrap(), vec![1.0, -2.0]);
        assert_eq!(a.to_bytes().unwrap(), v);
        let h = a.astype(Dtype::F16).unwrap();
        assert_eq!(h.dtype(), Dtype::F16);
        assert_eq!(h.nbytes(), 4);
    }

    #[test]
    fn sorting_sampling_and_slices() {
        let a = Array::from_f32(&[0.1, 5.0, -1.0, 3.0], &[1, 4]).unwrap();
        assert_eq!(a.argmax(-1, false).unwrap().to_vec_i32().unwrap(), vec![1]);
        let k = random::key(7).unwrap();
        let s1 = random::categorical(&a, &k).unwrap().item_i32().unwrap();
        let s2 = random::categorical(&a, &k).unwrap().item_i32().unwrap();
        assert_eq!(s1, s2, "same key must give the same draw");
        let s = a.slice_axis(1, 1, 3).unwrap();
        assert_eq!(s.to_vec_f32().unwrap(), vec![5.0, -1.0]);
        let z = Array::zeros(&[1, 4], Dtype::F32).unwrap();
        let u = z.slice_update(&s, &[0, 2], &[1, 4]).unwrap();
        assert_eq!(u.to_vec_f32().unwrap(), vec![0.0, 0.0, 5.0, -1.0]);
    }

    #[test]
    fn uninit_arrays_take_writes_and_refuse_impossible_sizes() {
        let u = Array::uninit(&[2, 3], Dtype::F16).unwrap();
        assert_eq!((u.shape(), u.dtype(), u.nbytes()), (vec![2, 3], Dtype::F16, 12));
        let x = Array::from_f32(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).unwrap().astype(Dtype::F16).unwrap();
        let w = u.slice_update(&x, &[0, 0], &[2, 3]).unwrap();
        assert_eq!(w.astype(Dtype::F32).unwrap().to_vec_f32().unwrap(), vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let err = Array::uninit(&[1 << 30, 1 << 30, 4], Dtype::F32).err().expect("2^64 bytes");
        assert!(err.to_string().contains("too large"), "{err}");
        let err = Array::uninit(&[1 << 30, 1 << 30], Dtype::F32).err().expect("2^62 bytes");
        assert!(err.to_string().contains("allocate"), "{err}");
        assert!(Array::uninit(&[-1, 4], Dtype::F32).is_err());
    }
}
