//! GGUF bytes through the model-file check (`mlxrt::model::check::gguf`),
//! and every file it accepts through MLX's own GGUF reader, the one the check
//! guards, then through the tokenizer built from its metadata: a file the
//! check passes must load or fail cleanly there, never read out of bounds. Errors are expected and fine; a panic, a hang or a
//! sanitizer report (or a crash inside libmlx) is a bug.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mlxrt::mlx::io::TensorFile;
use mlxrt::model::check::gguf;
use mlxrt::text::{GgufVocab, Tokenizer};
use std::path::PathBuf;
use std::sync::OnceLock;

/// One scratch file per fuzzing process, on tmpfs when there is one.
fn scratch() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let dir = if std::path::Path::new("/dev/shm").is_dir() { PathBuf::from("/dev/shm") } else { std::env::temp_dir() };
        dir.join(format!("mlxrt-fuzz-gguf-{}.gguf", std::process::id()))
    })
}

fuzz_target!(|data: &[u8]| {
    if gguf::check_bytes(data).is_err() {
        return;
    }
    let path = scratch();
    std::fs::write(path, data).expect("write the scratch file");
    if let Ok(mut file) = TensorFile::load_gguf(path.to_str().expect("a UTF-8 temp path")) {
        for key in file.meta_keys().unwrap_or_default() {
            let _ = file.meta(&key);
        }
        if let Ok(vocab) = GgufVocab::from_tensor_file(&file) {
            let _ = Tokenizer::from_gguf(&vocab);
        }
        for name in file.names().unwrap_or_default() {
            if let Ok(a) = file.take(&name) {
                let _ = a.shape();
            }
        }
    }
});
