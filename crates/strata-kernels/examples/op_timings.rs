//! Wall time of each conformance case on one backend: the same cases and shapes the
//! conformance tests run (`strata_kernels::conformance::CASES`), timed twice (the first
//! run includes one-time costs such as kernel loading). Times include the f64 reference
//! and the host-side setup, so they compare backends and commits, not kernels alone.
//!
//! ```sh
//! cargo run -p strata-kernels --example op_timings [-- CASE...]
//! cargo run -p strata-kernels --features cuda --example op_timings [-- CASE...]
//! ```
//!
//! With `cuda`, the CUDA backend runs where one starts, else the CPU backend. Naming cases
//! runs only those.

use std::time::{Duration, Instant};

use strata_kernels::conformance::{run_case, RowScaledQ8, CASES};
use strata_kernels::Backend;

fn main() {
    let only: Vec<String> = std::env::args().skip(1).collect();
    #[cfg(feature = "cuda")]
    {
        use strata_kernels::cuda::{CudaBackend, CudaQuantMatrix};
        match CudaBackend::new(0) {
            Ok(b) => {
                let quant = |q: &RowScaledQ8| {
                    let m = CudaQuantMatrix::from_f32(
                        &b,
                        q.rows,
                        q.cols,
                        &q.dequantized(),
                        strata_kernels::DType::F32,
                    );
                    Box::new(m.expect("quantized matrix upload"))
                };
                return time_cases(&b, &quant, &only);
            }
            Err(e) => eprintln!("no CUDA backend ({e}); timing the CPU backend"),
        }
    }
    let cpu = strata_kernels::cpu::CpuBackend::new();
    let quant = |q: &RowScaledQ8| -> Box<dyn strata_kernels::RowDot> { Box::new(q.clone()) };
    time_cases(&cpu, &quant, &only);
}

fn time_cases<B: Backend>(
    b: &B,
    quant: &dyn Fn(&RowScaledQ8) -> Box<B::QuantMatrix>,
    only: &[String],
) {
    println!(
        "{} backend, activations {:?}",
        b.name(),
        b.activation_dtype()
    );
    println!("{:<18} {:>12} {:>12}  result", "case", "first", "second");
    let ms = |d: Duration| format!("{:.1} ms", d.as_secs_f64() * 1e3);
    let mut total = Duration::ZERO;
    for case in CASES
        .iter()
        .filter(|c| only.is_empty() || only.iter().any(|o| o == c.name))
    {
        let mut times = [Duration::ZERO; 2];
        let mut result = Ok(());
        for t in &mut times {
            let t0 = Instant::now();
            result = run_case(case.name, b, quant).expect("a case of CASES");
            *t = t0.elapsed();
        }
        total += times[1];
        let verdict = match result {
            Ok(()) => "ok".to_string(),
            Err(e) => format!("FAILED: {e}"),
        };
        println!(
            "{:<18} {:>12} {:>12}  {verdict}",
            case.name,
            ms(times[0]),
            ms(times[1])
        );
    }
    println!("{:<18} {:>12} {:>12}", "total", "", ms(total));
}
