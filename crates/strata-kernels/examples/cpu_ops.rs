//! The CPU backend on its own, no model: two activation rows times a bf16 weight matrix
//! (`matmul`, weights `[out, in]` row-major as checkpoints store them), then an RMS norm of
//! the product (`rms_norm`), each printed beside the same sums written out in plain Rust.
//! A CUDA backend (feature `cuda`) runs the same calls through the same `Backend` trait.
use strata_kernels::cpu::CpuBackend;
use strata_kernels::{Backend, DType, MatmulShape, RmsNormParams};

fn main() -> Result<(), strata_kernels::KernelError> {
    let b = CpuBackend::new();
    let x: [[f32; 4]; 2] = [[1.0, 2.0, 3.0, 4.0], [-1.0, 0.5, 0.0, 2.0]]; // 2 tokens
    let w: [[f32; 4]; 3] = [[0.5, -1.0, 0.25, 2.0], [1.0; 4], [0.0, 0.5, -0.5, 0.25]];
    let gain = [1.0, 0.5, 2.0]; // the norm's weight
    let (k, n) = (4, 3);

    let x_buf = b.upload_f32_as(&x.concat(), DType::F32)?;
    let w_buf = b.upload_f32_as(&w.concat(), DType::BF16)?; // these values are exact in bf16
    let gain_buf = b.upload_f32_as(&gain, DType::F32)?;
    let shape = MatmulShape {
        in_features: k,
        out_features: n,
    };
    let mut y = b.zeros(x.len() * n, DType::F32)?;
    b.matmul(&x_buf, &w_buf, shape, &mut y)?;
    let mut z = b.zeros(x.len() * n, DType::F32)?;
    b.rms_norm(&y, Some(&gain_buf), RmsNormParams::new(n, 1e-6), &mut z)?;
    let (y, z) = (b.download(&y)?, b.download(&z)?);

    let (name, dtype) = (b.name(), b.activation_dtype());
    println!("backend {name}, activations {dtype:?}");
    for (t, row) in x.iter().enumerate() {
        let dot = |w_row: &[f32; 4]| w_row.iter().zip(row).map(|(a, b)| a * b).sum::<f32>();
        let y_ref: Vec<f32> = w.iter().map(dot).collect();
        let inv_rms = 1.0 / (y_ref.iter().map(|v| v * v).sum::<f32>() / n as f32 + 1e-6).sqrt();
        let z_ref: Vec<f32> = y_ref
            .iter()
            .zip(gain)
            .map(|(v, g)| v * inv_rms * g)
            .collect();
        let (y, z) = (&y[t * n..][..n], &z[t * n..][..n]);
        println!("token {t}: matmul   {y:8.4?}  plain Rust {y_ref:8.4?}");
        println!("         rms_norm {z:8.4?}  plain Rust {z_ref:8.4?}");
    }
    Ok(())
}
