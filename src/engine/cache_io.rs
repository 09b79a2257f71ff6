//! The prompt cache's file thread: writes and reads entry files so the
//! scheduler never waits on disk. Results come back as scheduler commands.

use super::scheduler::Command;
use crate::cache::store::{self, EntryFile};
use crossbeam_channel::{Receiver, Sender};
use std::path::PathBuf;

pub(crate) enum IoJob {
    Write { entry: EntryFile },
    Read { path: PathBuf },
    Delete(Vec<PathBuf>),
    /// Answered once every job before it is done.
    Barrier(Sender<()>),
}

pub(crate) enum IoDone {
    Written { namespace: String, tokens: Vec<u32>, result: Result<(PathBuf, u64), String> },
    Loaded { path: PathBuf, result: Result<EntryFile, String> },
}

pub(crate) fn spawn(dir: PathBuf, compat: String, done: Sender<Command>) -> std::io::Result<(Sender<IoJob>, std::thread::JoinHandle<()>)> {
    let (tx, rx) = crossbeam_channel::unbounded();
    let h = std::thread::Builder::new().name("mlxrt-cache-io".into()).spawn(move || run(&dir, &compat, &rx, &done))?;
    Ok((tx, h))
}

fn run(dir: &std::path::Path, compat: &str, rx: &Receiver<IoJob>, done: &Sender<Command>) {
    for job in rx.iter() {
        match job {
            IoJob::Write { entry } => {
                let name = store::file_name(&entry.namespace, &entry.tokens);
                let result = store::encode(&entry, compat).and_then(|bytes| {
                    store::write_atomic(dir, &name, &bytes).map(|p| (p, bytes.len() as u64)).map_err(|e| e.to_string())
                });
                let _ = done.send(Command::CacheIo(IoDone::Written { namespace: entry.namespace, tokens: entry.tokens, result }));
            }
            IoJob::Read { path } => {
                let result = std::fs::read(&path).map_err(|e| e.to_string()).and_then(|b| store::decode(&b, compat));
                let _ = done.send(Command::CacheIo(IoDone::Loaded { path, result }));
            }
            IoJob::Delete(paths) => {
                for p in paths {
                    let _ = std::fs::remove_file(p);
                }
            }
            IoJob::Barrier(reply) => {
                let _ = reply.send(());
            }
        }
    }
}
