//! Serving figures kept in atomics, rendered in the Prometheus text format by the server.

use std::sync::atomic::{AtomicU64, Ordering};

/// A histogram over fixed upper bounds (seconds).
pub struct Histogram {
    bounds: &'static [f64],
    /// One counter per bound plus the +Inf bucket (not cumulative here).
    counts: Vec<AtomicU64>,
    /// Sum in microseconds, to stay in integers.
    sum_us: AtomicU64,
}

impl Histogram {
    /// An empty histogram with these bucket upper bounds (ascending, seconds).
    pub fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_us: AtomicU64::new(0),
        }
    }

    /// Counts one value, in seconds.
    pub fn observe(&self, seconds: f64) {
        let i = self
            .bounds
            .iter()
            .position(|&b| seconds <= b)
            .unwrap_or(self.bounds.len());
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum_us
            .fetch_add((seconds * 1e6) as u64, Ordering::Relaxed);
    }

    /// Appends the series in Prometheus text format.
    pub fn render(&self, name: &str, help: &str, out: &mut String) {
        use std::fmt::Write;
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (i, b) in self.bounds.iter().enumerate() {
            cumulative += self.counts[i].load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {cumulative}");
        }
        cumulative += self.counts[self.bounds.len()].load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {cumulative}");
        let _ = writeln!(
            out,
            "{name}_sum {}",
            self.sum_us.load(Ordering::Relaxed) as f64 / 1e6
        );
        let _ = writeln!(out, "{name}_count {cumulative}");
    }
}

const LATENCY_BOUNDS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// Engine steps: a decode step of a small model on a GPU takes a few milliseconds.
const STEP_BOUNDS: &[f64] = &[
    0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.0,
];

/// The engine thread's host work between steps: tens of microseconds when all is well.
const GAP_BOUNDS: &[f64] = &[
    0.00002, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05,
];

/// Counters the engine thread and the server update.
pub struct Metrics {
    /// Requests finished, one counter per entry of [`FINISH_REASONS`].
    pub requests_finished: [AtomicU64; FINISH_REASONS.len()],
    /// Requests refused with a 4xx before reaching the engine.
    pub requests_rejected: AtomicU64,
    /// Requests refused because the waiting queue was full.
    pub requests_queue_full: AtomicU64,
    /// Prompt tokens of finished requests.
    pub prompt_tokens: AtomicU64,
    /// Tokens generated.
    pub generation_tokens: AtomicU64,
    /// Prompt tokens of finished requests served from the prefix cache.
    pub cached_tokens: AtomicU64,
    /// Seconds from a request's arrival at the engine to its first token.
    pub ttft: Histogram,
    /// Seconds between consecutive tokens of a request.
    pub inter_token: Histogram,
    /// One scheduler step: batch assembly, the forward pass, sampling.
    pub step: Histogram,
    /// The engine thread's time between two steps while requests run (handing tokens to
    /// clients, taking commands, publishing status): time the device waits on the host.
    pub step_gap: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            requests_finished: Default::default(),
            requests_rejected: AtomicU64::new(0),
            requests_queue_full: AtomicU64::new(0),
            prompt_tokens: AtomicU64::new(0),
            generation_tokens: AtomicU64::new(0),
            cached_tokens: AtomicU64::new(0),
            ttft: Histogram::new(LATENCY_BOUNDS),
            inter_token: Histogram::new(LATENCY_BOUNDS),
            step: Histogram::new(STEP_BOUNDS),
            step_gap: Histogram::new(GAP_BOUNDS),
        }
    }
}

/// The finish reasons counted in `requests_finished`, in index order.
/// How requests end: "timeout" past `--request-timeout`, "queue_timeout" past
/// `--queue-timeout` before starting.
pub const FINISH_REASONS: [&str; 6] = [
    "stop",
    "length",
    "cancelled",
    "error",
    "timeout",
    "queue_timeout",
];

impl Metrics {
    /// Counts a request finished with `reason` (one of [`FINISH_REASONS`]; others are not
    /// counted).
    pub fn finished(&self, reason: &str) {
        if let Some(i) = FINISH_REASONS.iter().position(|&r| r == reason) {
            self.requests_finished[i].fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let h = Histogram::new(&[0.1, 1.0]);
        h.observe(0.05);
        h.observe(0.5);
        h.observe(5.0);
        let mut s = String::new();
        h.render("x", "test", &mut s);
        assert!(s.contains("x_bucket{le=\"0.1\"} 1\n"), "{s}");
        assert!(s.contains("x_bucket{le=\"1\"} 2\n"), "{s}");
        assert!(s.contains("x_bucket{le=\"+Inf\"} 3\n"), "{s}");
        assert!(s.contains("x_count 3\n"), "{s}");
    }
}
