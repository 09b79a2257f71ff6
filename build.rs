//! Finds MLX, compiles the C++ shim against it, links libmlx with an rpath and
//! generates the C header with cbindgen.
//!
//! On Linux it also links Debian's OpenBLAS, when present, so that MLX's dense
//! CPU matmul runs on it instead of the wheel's reference BLAS (see
//! `link_openblas` and docs/cpu-kernels.md).
//!
//! MLX is found in this order: `$MLX_DIR` (the unpacked `mlx` package folder,
//! holding `include/` and `lib/`), then the `mlx` package of the project venv's
//! Python (`.venv/bin/python`), then of `python3` on PATH.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

fn python_mlx_dir(python: &Path) -> Option<PathBuf> {
    // `mlx` is a namespace package: `mlx.__file__` is None, `__path__` is not.
    let out = Command::new(python)
        .args(["-c", "import mlx; print(list(mlx.__path__)[0])"])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let dir = PathBuf::from(String::from_utf8(out.stdout).ok()?.trim());
    dir.join("include/mlx/mlx.h").exists().then_some(dir)
}

fn find_mlx(root: &Path) -> PathBuf {
    if let Ok(dir) = env::var("MLX_DIR") {
        let dir = PathBuf::from(dir);
        if !dir.join("include/mlx/mlx.h").exists() {
            panic!("MLX_DIR={} has no include/mlx/mlx.h", dir.display());
        }
        return dir;
    }
    let venv = root.join(".venv/bin/python");
    if let Some(d) = python_mlx_dir(&venv) {
        return d;
    }
    if let Some(d) = python_mlx_dir(Path::new("python3")) {
        return d;
    }
    panic!(
        "MLX not found: run scripts/setup.sh (creates .venv with the pinned mlx wheel) \
         or set MLX_DIR to the `mlx` package folder"
    );
}

/// mlxrt's CPU primitives (quantized matmul, SwiGLU, quantized-KV, float
/// and paged attention, the paged KV write, RMSNorm and RoPE, the TurboQuant encoder) and their per-instruction-set kernels. The kernels pick
/// their instruction set per function (`target` attributes), so all files
/// share the crate's compiler flags.
const KERNEL_FILES: [&str; 30] = [
    "src/mlx/pool.h",
    "src/mlx/qmm.h",
    "src/mlx/qmm.cc",
    "src/mlx/qmm_kernels.h",
    "src/mlx/qmm_impl.h",
    "src/mlx/qmm_avx512.cc",
    "src/mlx/qmm_avx2.cc",
    "src/mlx/qmm_portable.cc",
    "src/mlx/swiglu.h",
    "src/mlx/swiglu.cc",
    "src/mlx/swiglu_kernels.h",
    "src/mlx/swiglu_kernels.cc",
    "src/mlx/qsdpa.h",
    "src/mlx/qsdpa.cc",
    "src/mlx/qsdpa_kernels.h",
    "src/mlx/qsdpa_impl.h",
    "src/mlx/qsdpa_kernels.cc",
    "src/mlx/tqsdpa.h",
    "src/mlx/tqsdpa.cc",
    "src/mlx/tqsdpa_kernels.h",
    "src/mlx/tqsdpa_impl.h",
    "src/mlx/fattn.h",
    "src/mlx/fattn.cc",
    "src/mlx/fattn_impl.h",
    "src/mlx/fused.h",
    "src/mlx/fused.cc",
    "src/mlx/tqenc.h",
    "src/mlx/tqenc.cc",
    "src/mlx/paged.h",
    "src/mlx/paged.cc",
];

/// The cxx bridges to MLX and to those primitives.
const BRIDGES: [&str; 9] = [
    "src/mlx/sys.rs",
    "src/mlx/qmm_sys.rs",
    "src/mlx/swiglu_sys.rs",
    "src/mlx/qsdpa_sys.rs",
    "src/mlx/tqsdpa_sys.rs",
    "src/mlx/fattn_sys.rs",
    "src/mlx/fused_sys.rs",
    "src/mlx/tqenc_sys.rs",
    "src/mlx/paged_sys.rs",
];

/// Where Debian/Ubuntu (libopenblas0-pthread), Fedora and source installs put
/// OpenBLAS's runtime library.
fn openblas_candidates() -> Vec<PathBuf> {
    let arch = env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let mut dirs = vec![format!("/usr/lib/{arch}-linux-gnu")];
    dirs.extend(["/usr/lib64", "/usr/lib", "/usr/local/lib", "/opt/OpenBLAS/lib"].map(String::from));
    dirs.into_iter().map(|d| Path::new(&d).join("libopenblas.so.0")).collect()
}

/// Makes the linked library (and test/example binaries) depend directly on
/// OpenBLAS. libmlx.so only reaches its bundled reference BLAS through its own
/// DT_NEEDED, one level further down the dependency tree, so the dynamic
/// linker's breadth-first symbol lookup binds MLX's `cblas_sgemm` to OpenBLAS,
/// for executables and dlopen'd libraries alike, with the wheel untouched.
/// `MLXRT_OPENBLAS` names the library explicitly, or `0` builds without it.
/// Without OpenBLAS the build still works (MLX's matmul is then slow).
fn link_openblas() {
    if env::var("CARGO_CFG_TARGET_OS").as_deref() != Ok("linux") {
        return;
    }
    let chosen = match env::var("MLXRT_OPENBLAS") {
        Ok(v) if v == "0" || v.eq_ignore_ascii_case("off") => {
            println!("cargo:rustc-env=MLXRT_BUILD_OPENBLAS=");
            return;
        }
        Ok(v) if !v.is_empty() => {
            let p = PathBuf::from(&v);
            if !p.exists() {
                panic!("MLXRT_OPENBLAS={v} does not exist");
            }
            Some(p)
        }
        _ => openblas_candidates().into_iter().find(|p| p.exists()),
    };
    let Some(path) = chosen else {
        println!(
            "cargo:warning=OpenBLAS (libopenblas.so.0) not found: MLX's dense CPU matmul will use \
             the wheel's reference BLAS (correct but slow). Install libopenblas0-pthread or set \
             MLXRT_OPENBLAS=/path/to/libopenblas.so.0"
        );
        println!("cargo:rustc-env=MLXRT_BUILD_OPENBLAS=");
        return;
    };
    // rustc links with --as-needed, which would drop a library none of our own
    // symbols reference; keep this one.
    println!("cargo:rustc-link-arg=-Wl,--push-state,--no-as-needed");
    println!("cargo:rustc-link-arg={}", path.display());
    println!("cargo:rustc-link-arg=-Wl,--pop-state");
    let arch = env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let system = [format!("/usr/lib/{arch}-linux-gnu"), "/usr/lib64".into(), "/usr/lib".into()];
    if let Some(dir) = path.parent().filter(|d| !system.iter().any(|s| Path::new(s) == *d)) {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
    }
    println!("cargo:rustc-env=MLXRT_BUILD_OPENBLAS={}", path.display());
}

/// Exports only the `mlxrt_` C API from the cdylib. rustc exports every
/// `#[no_mangle]` symbol of every crate, which includes cxx's runtime
/// (`cxxbridge1$...`, from the cxx rlib), and hands the linker its own version
/// script listing them by name, which a wildcard `local: *` in a second
/// script cannot override. So on ELF `--exclude-libs,ALL` makes everything
/// that comes from an archive (every dependency rlib, the C++ shim) local,
/// and the version script does the same for anything else that is not
/// `mlxrt_*`; the API itself lives in this crate's own objects.
/// tests/symbols.rs checks the result with `nm -D`.
///
/// ld64 (macOS) takes an exported-symbols list, but it unions several lists,
/// so ours does not remove what rustc's own list names (unverified here:
/// there is no macOS machine in CI).
fn limit_exports(root: &Path) {
    let os = env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let file = match os.as_str() {
        "macos" | "ios" => {
            let f = root.join("link/mlxrt.exported_symbols");
            println!("cargo:rustc-cdylib-link-arg=-Wl,-exported_symbols_list,{}", f.display());
            f
        }
        "windows" => return,
        _ => {
            let f = root.join("link/mlxrt.map");
            println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={}", f.display());
            println!("cargo:rustc-cdylib-link-arg=-Wl,--exclude-libs,ALL");
            f
        }
    };
    println!("cargo:rerun-if-changed={}", file.display());
}

fn main() {
    let root = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    println!("cargo:rerun-if-env-changed=MLX_DIR");
    println!("cargo:rerun-if-env-changed=MLXRT_OPENBLAS");
    for f in BRIDGES.iter().chain(&["src/mlx/shim.h", "src/mlx/shim.cc", "cbindgen.toml", "src/ffi"]) {
        println!("cargo:rerun-if-changed={f}");
    }
    for f in KERNEL_FILES {
        println!("cargo:rerun-if-changed={f}");
    }

    let mlx = find_mlx(&root);
    let lib = mlx.join("lib");
    cxx_build::bridges(BRIDGES)
        .file("src/mlx/shim.cc")
        .files(KERNEL_FILES.iter().filter(|f| f.ends_with(".cc")))
        .include(mlx.join("include"))
        .std("c++20")
        .flag_if_supported("-O2")
        .flag_if_supported("-Wno-unused-parameter")
        .compile("mlxrt_shim");
    println!("cargo:rustc-link-search=native={}", lib.display());
    println!("cargo:rustc-link-lib=dylib=mlx");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
    println!("cargo:rustc-env=MLXRT_MLX_DIR={}", mlx.display());
    link_openblas();
    limit_exports(&root);

    // The header is generated into OUT_DIR; tests/header.rs compares it with the
    // committed include/mlxrt.h, which `MLXRT_UPDATE_HEADER=1 cargo build`
    // (scripts/update-header.sh) overwrites.
    println!("cargo:rerun-if-env-changed=MLXRT_UPDATE_HEADER");
    let mut config = cbindgen::Config::from_file(root.join("cbindgen.toml")).expect("cbindgen.toml");
    let version = env::var("CARGO_PKG_VERSION").unwrap();
    config.after_includes = Some(format!(
        "{}\n/** The version of mlxrt this header belongs to. */\n#define MLXRT_VERSION \"{version}\"\n",
        config.after_includes.unwrap_or_default()
    ));
    let header = out.join("mlxrt.h");
    match cbindgen::Builder::new()
        .with_crate(&root)
        .with_config(config)
        .generate()
    {
        Ok(b) => {
            b.write_to_file(&header);
        }
        Err(e) => panic!("cbindgen failed: {e}"),
    }
    println!("cargo:rustc-env=MLXRT_GENERATED_HEADER={}", header.display());
    if env::var_os("MLXRT_UPDATE_HEADER").is_some_and(|v| v == "1") {
        std::fs::create_dir_all(root.join("include")).expect("create include/");
        std::fs::copy(&header, root.join("include/mlxrt.h")).expect("copy the header to include/");
    }
}
