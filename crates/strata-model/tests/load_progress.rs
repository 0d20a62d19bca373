//! `LoadOptions::progress`: told of each step of a load, in order, up to the whole.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use strata_kernels::cpu::CpuBackend;
use strata_model::{LoadOptions, LoadProgress, Model};

#[test]
fn a_load_reports_each_step_up_to_the_whole() {
    let dir =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny/gemma4-tiny");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = seen.clone();
    let opts = LoadOptions {
        progress: Some(LoadProgress(Arc::new(move |done, total| {
            sink.lock().unwrap().push((done, total));
        }))),
        ..Default::default()
    };
    let model = Model::load_with(CpuBackend::new(), &dir, opts).unwrap();
    let layers = model.config().num_layers();
    let seen = seen.lock().unwrap().clone();
    // The embeddings, each layer, the output projection.
    let want: Vec<(usize, usize)> = (1..=layers + 2).map(|d| (d, layers + 2)).collect();
    assert_eq!(seen, want);
}
