//! CPU-only properties: bit-exact determinism across tiling and thread counts, the paged
//! (KvSource) attention path, and dtype errors.

use strata_kernels::conformance::{RowScaledQ8, TestData};
use strata_kernels::cpu::{CpuBackend, CpuBuffer, KvSource};
use strata_kernels::{AttentionParams, Backend, DType, KernelError, MatmulShape, RmsNormParams};

fn upload(b: &CpuBackend, x: &[f32], dt: DType) -> CpuBuffer {
    b.upload_f32_as(x, dt).unwrap()
}

#[test]
fn matmul_of_many_tokens_equals_one_token_at_a_time_bit_for_bit() {
    let b = CpuBackend::new();
    let (t, k, n) = (37, 300, 45);
    let mut data = TestData::new(1);
    let x = data.normals(t * k, 1.0, DType::F32);
    for dt in [DType::F32, DType::BF16, DType::F16] {
        let w = upload(&b, &data.normals(n * k, 0.1, dt), dt);
        let shape = MatmulShape {
            in_features: k,
            out_features: n,
        };
        let mut all = b.zeros(t * n, DType::F32).unwrap();
        b.matmul(&upload(&b, &x, DType::F32), &w, shape, &mut all)
            .unwrap();
        let all = b.download(&all).unwrap();
        for i in 0..t {
            let mut one = b.zeros(n, DType::F32).unwrap();
            let xi = upload(&b, &x[i * k..(i + 1) * k], DType::F32);
            b.matmul(&xi, &w, shape, &mut one).unwrap();
            assert_eq!(
                b.download(&one).unwrap(),
                all[i * n..(i + 1) * n],
                "{dt:?} token {i}"
            );
        }
    }
}

#[test]
fn results_do_not_depend_on_thread_count() {
    let one = CpuBackend::with_threads(1).unwrap();
    let two = CpuBackend::with_threads(2).unwrap();
    let (t, k, n) = (9, 1000, 300);
    let mut data = TestData::new(2);
    let x = data.normals(t * k, 1.0, DType::F32);
    let w = data.normals(n * k, 0.1, DType::BF16);
    let run = |b: &CpuBackend| {
        let mut out = b.zeros(t * n, DType::F32).unwrap();
        let shape = MatmulShape {
            in_features: k,
            out_features: n,
        };
        b.matmul(
            &upload(b, &x, DType::F32),
            &upload(b, &w, DType::BF16),
            shape,
            &mut out,
        )
        .unwrap();
        let mut normed = b.zeros(t * n, DType::F32).unwrap();
        b.rms_norm(&out, None, RmsNormParams::new(n, 1e-6), &mut normed)
            .unwrap();
        b.download(&normed).unwrap()
    };
    assert_eq!(run(&one), run(&two));
}

/// A paged pool stand-in: int8 rows with one f32 scale per (token, kv head), stored in
/// shuffled slots and read through a slot table, the way the KV pool keeps them.
struct Int8Pages {
    slots: Vec<usize>,
    positions: Vec<u32>,
    k: Vec<i8>,
    v: Vec<i8>,
    k_scale: Vec<f32>,
    v_scale: Vec<f32>,
    n_kv_heads: usize,
    d: usize,
}

impl Int8Pages {
    fn dequant(&self, q: &[i8], scales: &[f32], i: usize, h: usize, out: &mut [f32]) {
        let row = self.slots[i] * self.n_kv_heads + h;
        for (o, &q) in out.iter_mut().zip(&q[row * self.d..(row + 1) * self.d]) {
            *o = q as f32 * scales[row];
        }
    }
}

impl KvSource for Int8Pages {
    fn num_keys(&self) -> usize {
        self.slots.len()
    }
    fn position(&self, i: usize) -> u32 {
        self.positions[i]
    }
    fn key<'a>(&'a self, i: usize, h: usize, scratch: &'a mut [f32]) -> &'a [f32] {
        self.dequant(&self.k, &self.k_scale, i, h, scratch);
        scratch
    }
    fn value<'a>(&'a self, i: usize, h: usize, scratch: &'a mut [f32]) -> &'a [f32] {
        self.dequant(&self.v, &self.v_scale, i, h, scratch);
        scratch
    }
}

#[test]
fn paged_int8_attention_equals_contiguous_attention_on_dequantized_rows() {
    let b = CpuBackend::new();
    let (keys, nkv, nh, d) = (29, 2, 4, 64);
    let mut data = TestData::new(3);
    let rows = keys * nkv;
    let quant = |data: &mut TestData| {
        let x = data.normals(rows * d, 1.0, DType::F32);
        RowScaledQ8::quantize(&x, rows, d)
    };
    let (kq, vq) = (quant(&mut data), quant(&mut data));
    // Slot s of the pool holds key slots[s]... any permutation will do.
    let slots: Vec<usize> = (0..keys).map(|i| (i * 7) % keys).collect();
    let pages = Int8Pages {
        slots: slots.clone(),
        positions: (0..keys as u32).collect(),
        k: kq.q.clone(),
        v: vq.q.clone(),
        k_scale: kq.scales.clone(),
        v_scale: vq.scales.clone(),
        n_kv_heads: nkv,
        d,
    };
    // The same keys gathered into contiguous f32 [S, nkv, d] in logical order.
    let gather = |q: &RowScaledQ8| -> Vec<f32> {
        let full = q.dequantized();
        slots
            .iter()
            .flat_map(|&s| full[s * nkv * d..(s + 1) * nkv * d].iter().copied())
            .collect()
    };
    let (k, v) = (gather(&kq), gather(&vq));
    let q_pos = [20u32, 27, 28];
    let qx = upload(
        &b,
        &data.normals(q_pos.len() * nh * d, 0.3, DType::F32),
        DType::F32,
    );
    let p = AttentionParams {
        n_heads: nh,
        n_kv_heads: nkv,
        head_dim: d,
        scale: 0.125,
        window: Some(10),
        causal: true,
        softcap: None,
    };
    let k_pos: Vec<u32> = (0..keys as u32).collect();
    let mut want = b.zeros(q_pos.len() * nh * d, DType::F32).unwrap();
    let (kb, vb) = (upload(&b, &k, DType::F32), upload(&b, &v, DType::F32));
    b.attention(&qx, &kb, &vb, &q_pos, &k_pos, p, &mut want)
        .unwrap();
    let mut got = b.zeros(q_pos.len() * nh * d, DType::F32).unwrap();
    b.attention_paged(&qx, &q_pos, &pages, p, &mut got).unwrap();
    assert_eq!(b.download(&got).unwrap(), b.download(&want).unwrap());
}

#[test]
fn non_f32_activations_are_refused_with_a_dtype_error() {
    let b = CpuBackend::new();
    let x = upload(&b, &[1.0; 8], DType::BF16);
    let mut out = b.zeros(8, DType::F32).unwrap();
    let err = b
        .rms_norm(&x, None, RmsNormParams::new(8, 1e-6), &mut out)
        .unwrap_err();
    assert_eq!(
        err,
        KernelError::DType {
            op: "rms_norm",
            dtype: DType::BF16
        }
    );
}
