//! Finds MLX, compiles the C++ shim against it, links libmlx with an rpath and
//! generates the C header with cbindgen.
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

fn main() {
    let root = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    println!("cargo:rerun-if-env-changed=MLX_DIR");
    for f in ["src/mlx/shim.h", "src/mlx/shim.cc", "src/mlx/sys.rs", "cbindgen.toml", "src/ffi"] {
        println!("cargo:rerun-if-changed={f}");
    }

    let mlx = find_mlx(&root);
    let lib = mlx.join("lib");
    cxx_build::bridge("src/mlx/sys.rs")
        .file("src/mlx/shim.cc")
        .include(mlx.join("include"))
        .std("c++20")
        .flag_if_supported("-O2")
        .flag_if_supported("-Wno-unused-parameter")
        .compile("mlxrt_shim");
    println!("cargo:rustc-link-search=native={}", lib.display());
    println!("cargo:rustc-link-lib=dylib=mlx");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
    println!("cargo:rustc-env=MLXRT_MLX_DIR={}", mlx.display());

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
