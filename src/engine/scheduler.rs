//! The scheduler thread: owns the model and every MLX array, takes commands
//! from host threads, and runs requests in FIFO order, one unit of work
//! (a prefill chunk or a decode step) at a time so that commands such as
//! cancel are seen between units.

use super::delivery::{self, DeliveryTx, Msg};
use super::generation::{Generation, Progress};
use super::request::{Event, FinishReason, Job, Usage};
use super::{Device, EngineConfig, Shared};
use crate::error::{Error, Result};
use crate::mlx;
use crate::model::load::TextAssets;
use crate::model::{self, LanguageModel, LoadOptions, ModelInfo};
use crossbeam_channel::{Receiver, Sender};
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::Arc;

pub(crate) enum Command {
    Submit(Job),
    /// Wakes the scheduler after a request's cancel flag was set.
    Cancel(u64),
    Shutdown,
}

/// What the scheduler reports once the model is loaded (or failed to load).
pub(crate) type Ready = Result<(Arc<TextAssets>, ModelInfo, usize)>;

pub(crate) fn spawn(
    config: EngineConfig,
    shared: Arc<Shared>,
    rx: Receiver<Command>,
    ready: Sender<Ready>,
) -> std::io::Result<(std::thread::JoinHandle<()>, std::thread::JoinHandle<()>)> {
    let (dtx, drx) = crossbeam_channel::unbounded();
    let delivery = std::thread::Builder::new()
        .name("mlxrt-delivery".into())
        .spawn(move || delivery::run(drx))?;
    let dtx2 = dtx.clone();
    let sched = std::thread::Builder::new().name("mlxrt-scheduler".into()).spawn(move || {
        let run = catch_unwind(AssertUnwindSafe(|| main(config, &shared, &rx, &ready, &dtx)));
        if let Err(panic) = run {
            let why = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panic on the scheduler thread".into());
            shared.poisoned.store(true, Ordering::Release);
            let _ = dtx.send(Msg::Poisoned(why.clone()));
            // Keep serving the channel so that late submissions still get
            // their (error) terminal event and destroy can join us.
            drain_poisoned(&rx, &dtx, &shared);
        }
        let _ = dtx.send(Msg::Shutdown);
    });
    match sched {
        Ok(s) => Ok((s, delivery)),
        Err(e) => {
            let _ = dtx2.send(Msg::Shutdown);
            let _ = delivery.join();
            Err(e)
        }
    }
}

fn drain_poisoned(rx: &Receiver<Command>, dtx: &DeliveryTx, shared: &Shared) {
    for cmd in rx.iter() {
        match cmd {
            Command::Submit(job) => {
                shared.in_flight.fetch_sub(1, Ordering::AcqRel);
                let _ = dtx.send(Msg::Open(job.state.id, job.sink));
            }
            Command::Cancel(_) => {}
            Command::Shutdown => break,
        }
    }
}

struct Scheduler<'a> {
    model: Box<dyn LanguageModel>,
    text: Arc<TextAssets>,
    config: EngineConfig,
    shared: &'a Shared,
    dtx: DeliveryTx,
    queue: VecDeque<Job>,
    active: Option<Generation>,
    ctx_len: usize,
    seed_counter: u64,
}

fn main(config: EngineConfig, shared: &Shared, rx: &Receiver<Command>, ready: &Sender<Ready>, dtx: &DeliveryTx) {
    let loaded = (|| -> Result<_> {
        match config.device {
            Device::Cpu => mlx::device::set_default(false)?,
            Device::Gpu => {
                if !mlx::device::gpu_available() {
                    return Err(Error::unsupported("device GPU requested but MLX has no GPU backend here"));
                }
                mlx::device::set_default(true)?
            }
            Device::Auto => {}
        }
        let opts = LoadOptions { cpu_f32_scales: true };
        model::load(&config.model_path, &opts)
    })();
    let loaded = match loaded {
        Ok(l) => l,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let text = Arc::new(loaded.text);
    let info = loaded.model.info().clone();
    let _ = ready.send(Ok((text.clone(), info.clone(), loaded.parameter_bytes)));
    let mut s = Scheduler {
        model: loaded.model,
        text,
        shared,
        dtx: dtx.clone(),
        queue: VecDeque::new(),
        active: None,
        ctx_len: if info.context_length > 0 { info.context_length as usize } else { 0 },
        seed_counter: config.seed,
        config,
    };
    s.run(rx);
}

impl Scheduler<'_> {
    fn run(&mut self, rx: &Receiver<Command>) {
        loop {
            let idle = self.active.is_none() && self.queue.is_empty();
            let first = if idle { rx.recv().ok() } else { rx.try_recv().ok() };
            let mut shutdown = first.is_none() && idle;
            for cmd in first.into_iter().chain(std::iter::from_fn(|| rx.try_recv().ok())) {
                match cmd {
                    Command::Submit(job) => self.queue.push_back(job),
                    Command::Cancel(id) => self.cancel_queued(id),
                    Command::Shutdown => shutdown = true,
                }
            }
            if shutdown {
                self.cancel_all();
                return;
            }
            self.work();
            self.publish_stats();
        }
    }

    /// Starts the next queued request if none runs, then runs one unit.
    fn work(&mut self) {
        if self.active.is_none() {
            let Some(job) = self.queue.pop_front() else { return };
            if job.state.is_cancelled() {
                self.end_queued(job);
                return;
            }
            self.seed_counter = self.seed_counter.wrapping_add(1);
            let id = job.state.id;
            match Generation::start(job, self.model.as_ref(), &self.text, self.seed_counter, self.dtx.clone()) {
                Ok(g) => self.active = Some(g),
                Err(e) => {
                    // `start` hands the sink to delivery before anything can fail.
                    let _ = self.dtx.send(Msg::Event(id, Event::Error(e)));
                    self.shared.in_flight.fetch_sub(1, Ordering::AcqRel);
                }
            }
            return;
        }
        let g = self.active.as_mut().expect("checked above");
        if g.state.is_cancelled() {
            let g = self.active.take().expect("checked above");
            g.cancel();
            self.request_ended();
            return;
        }
        match g.step(self.model.as_ref(), &self.text, self.config.prefill_chunk, self.ctx_len) {
            Ok(Progress::Running) => {}
            Ok(Progress::Finished) => {
                self.active = None;
                self.request_ended();
            }
            Err(e) => {
                let g = self.active.take().expect("checked above");
                g.fail(e);
                self.request_ended();
            }
        }
    }

    fn request_ended(&mut self) {
        self.shared.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.shared.completed.fetch_add(1, Ordering::Relaxed);
        mlx::memory::clear_cache();
    }

    /// A request cancelled (or shut down) before it started.
    fn end_queued(&mut self, job: Job) {
        let id = job.state.id;
        let _ = self.dtx.send(Msg::Open(id, job.sink));
        let usage = Usage { prompt_tokens: job.prompt.len() as u32, ..Default::default() };
        let _ = self.dtx.send(Msg::Event(id, Event::Done { finish: FinishReason::Cancelled, stop_index: None, usage }));
        self.shared.in_flight.fetch_sub(1, Ordering::AcqRel);
    }

    fn cancel_queued(&mut self, id: u64) {
        if let Some(pos) = self.queue.iter().position(|j| j.state.id == id) {
            let job = self.queue.remove(pos).expect("position is valid");
            self.end_queued(job);
        }
    }

    fn cancel_all(&mut self) {
        if let Some(g) = self.active.take() {
            g.cancel();
            self.shared.in_flight.fetch_sub(1, Ordering::AcqRel);
        }
        while let Some(job) = self.queue.pop_front() {
            self.end_queued(job);
        }
    }

    fn publish_stats(&self) {
        let s = &self.shared.stats;
        s.queued.store(self.queue.len(), Ordering::Relaxed);
        s.active.store(self.active.is_some() as usize, Ordering::Relaxed);
        s.active_memory.store(mlx::memory::active(), Ordering::Relaxed);
        s.peak_memory.store(mlx::memory::peak(), Ordering::Relaxed);
        s.cache_memory.store(mlx::memory::cache(), Ordering::Relaxed);
    }
}
