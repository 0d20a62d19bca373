//! Drift verification on the tiny fixtures: each perturb-and-refresh cycle changes the
//! served weights (digests and greedy output), and the refresh restores them bit for bit.

use std::path::Path;

use strata_engine::{verify_drift, Device, LoadedModel};

fn check(name: &str) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/tiny")
        .join(name);
    let loaded = LoadedModel::load(&dir, Device::Cpu).unwrap();
    let prompt: Vec<u32> = (5..17).collect();
    let report = verify_drift(&loaded, 4, &prompt, 12).unwrap();
    assert_eq!(report.cycles.len(), 4);
    assert_eq!(report.reference_tokens.len(), 12);
    for c in &report.cycles {
        // Every matrix (not the norms) was scaled.
        assert!(c.perturbed_tensors > 0, "{name}: {c:?}");
        assert_eq!(c.drifted_tensors, 0, "{name}: {c:?}");
        assert!(c.output_identical, "{name}: {c:?}");
    }
    // The perturbations were large enough to change what the model says.
    assert!(
        report.cycles.iter().any(|c| c.perturbed_output_differs),
        "{name}: {report:?}"
    );
    assert!(report.passed());
}

#[test]
fn refreshes_restore_the_llama_weights_exactly() {
    check("llama-tiny");
}

#[test]
fn refreshes_restore_the_gemma4_weights_exactly() {
    check("gemma4-tiny");
}
