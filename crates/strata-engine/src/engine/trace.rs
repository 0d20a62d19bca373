//! A trace of every engine step (`EngineOptions::step_trace`, `strata serve --step-trace`):
//! one CSV line a `Scheduler::step` call, so a served run's time can be split into decode
//! steps, prefill steps and the host's work between them without a profiler.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::time::Instant;

use strata_sched::LaunchShape;

/// The trace file's first line.
const STEP_TRACE_HEADER: &str =
    "start_ms,step_ms,launch_ms,single_rows,chunk_tokens,overlapped,running,waiting,drafts";

pub(crate) struct StepTrace {
    out: BufWriter<File>,
    origin: Instant,
}

/// One step call as the trace records it.
pub(crate) struct TracedStep {
    pub start: Instant,
    pub end: Instant,
    /// What the call queued (`None`: it only read a step, or had nothing to run).
    pub launch: Option<LaunchShape>,
    pub running: usize,
    pub waiting: usize,
}

impl StepTrace {
    pub(crate) fn create(path: &Path) -> std::io::Result<Self> {
        let mut out = BufWriter::new(File::create(path)?);
        writeln!(out, "{STEP_TRACE_HEADER}")?;
        Ok(Self {
            out,
            origin: Instant::now(),
        })
    }

    /// Appends a line. A failed write ends the trace (the engine goes on): returns false.
    pub(crate) fn record(&mut self, s: &TracedStep) -> bool {
        let (rows, tokens, overlapped, launch, drafts) =
            s.launch.map_or((0, 0, false, 0.0, 0), |l| {
                (
                    l.single_rows,
                    l.chunk_tokens,
                    l.overlapped,
                    l.launch_seconds,
                    l.drafts,
                )
            });
        writeln!(
            self.out,
            "{:.3},{:.3},{:.3},{rows},{tokens},{},{},{},{drafts}",
            (s.start - self.origin).as_secs_f64() * 1e3,
            (s.end - s.start).as_secs_f64() * 1e3,
            launch * 1e3,
            u8::from(overlapped),
            s.running,
            s.waiting
        )
        .is_ok()
    }

    /// Writes out what is buffered (called when the engine goes idle, so a finished run's
    /// trace is complete on disk while the server keeps running).
    pub(crate) fn flush(&mut self) -> bool {
        self.out.flush().is_ok()
    }
}
