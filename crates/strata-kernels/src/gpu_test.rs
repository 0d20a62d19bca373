//! How every GPU test in the workspace meets a machine without a GPU, in one place.
//!
//! Rust's test harness cannot mark a test skipped at run time, so a GPU test that finds no
//! backend returns early and passes. To keep that from reading as a GPU pass, each such
//! test prints `<test name>: skipped: no GPU` (stderr, shown with `--nocapture` or
//! `--show-output`), and the first one in a process also writes the reason straight to
//! stderr, so it shows in a plain `cargo test` run as well. With `STRATA_REQUIRE_GPU` set
//! (the GPU bundle's script sets it) a missing GPU is a failure instead.

use std::collections::HashSet;
use std::fmt::Display;
use std::io::Write;
use std::sync::Mutex;

/// The line each skipped GPU test prints (after its name).
pub const SKIPPED: &str = "skipped: no GPU";

/// Whether a missing GPU fails the test (`STRATA_REQUIRE_GPU` set) rather than skipping it.
pub fn gpu_required() -> bool {
    std::env::var_os("STRATA_REQUIRE_GPU").is_some()
}

/// `opened` (a backend's start) as `Some`, or `None` after reporting the skip: the calling
/// test's name with [`SKIPPED`], once a test, and the reason once a process. Panics
/// instead where [`gpu_required`].
pub fn gpu_or_skip<T, E: Display>(opened: Result<T, E>) -> Option<T> {
    match opened {
        Ok(b) => Some(b),
        Err(e) => {
            assert!(
                !gpu_required(),
                "STRATA_REQUIRE_GPU is set but the CUDA backend did not start: {e}"
            );
            report_skip(&e.to_string());
            None
        }
    }
}

/// Prints the skip for the current test (its thread's name, which the harness sets to the
/// test's), once a test even where it asks for the backend many times (property tests).
fn report_skip(reason: &str) {
    static SEEN: Mutex<Option<HashSet<String>>> = Mutex::new(None);
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("a GPU test").to_string();
    let mut seen = SEEN.lock().unwrap_or_else(|p| p.into_inner());
    let seen = seen.get_or_insert_with(HashSet::new);
    if seen.is_empty() {
        // Uncaptured (the harness captures only the print macros), so the reason shows
        // once in a plain run; the per-test lines below are captured like any output.
        let _ = writeln!(
            std::io::stderr(),
            "note: no CUDA backend ({reason}); the GPU tests of this binary pass as \
             `{SKIPPED}` without running (STRATA_REQUIRE_GPU=1 makes that a failure)"
        );
    }
    if seen.insert(test.clone()) {
        eprintln!("{test}: {SKIPPED}");
    }
}
