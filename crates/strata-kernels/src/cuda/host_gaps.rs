//! `STRATA_HOST_GAPS_MS=T` ([`crate::CudaTuning::host_gaps_ms`]): reports on stderr every gap of at least T ms between two
//! consecutive device calls of a thread (kernel launches and cuBLAS calls), with the calls
//! on either side. A step's host time is the sum of its gaps, so the pairs that take the
//! most say where the host stalls (a cuBLAS call that waits on its heuristics, a copy
//! that waits on the device). Off, each call costs one read of a cached setting.

use std::cell::Cell;
use std::time::Instant;

thread_local! {
    static LAST: Cell<Option<(Instant, &'static str)>> = const { Cell::new(None) };
}

/// Notes that the thread is about to make the device call `name`.
pub(super) fn mark(name: &'static str) {
    let Some(t) = crate::CudaTuning::get().host_gaps_ms else {
        return;
    };
    let now = Instant::now();
    LAST.with(|last| {
        if let Some((at, prev)) = last.get() {
            let ms = now.duration_since(at).as_secs_f64() * 1e3;
            if ms >= t {
                eprintln!("[host-gap] {ms:.3} ms {prev} -> {name}");
            }
        }
        last.set(Some((now, name)));
    });
}
