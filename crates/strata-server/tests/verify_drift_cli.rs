//! `strata verify-drift` on the tiny Llama: every cycle perturbs the weights and the refresh
//! restores them; the table and the verdict are printed, and the exit code says it.

use std::path::Path;
use std::process::Command;

#[test]
fn verify_drift_passes_on_a_dense_checkpoint() {
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny/llama-tiny");
    let out = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["verify-drift", "--model"])
        .arg(&model)
        .args(["--cycles", "3", "--tokens", "8", "--device", "cpu"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout
            .lines()
            .filter(|l| l.starts_with("| ") && l.ends_with("| 0 | true |"))
            .count(),
        3,
        "{stdout}"
    );
    assert!(stdout.contains("passed"), "{stdout}");
}
