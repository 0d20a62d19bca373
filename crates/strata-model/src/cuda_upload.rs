//! Quantized weights on the CUDA backend: the GGUF block formats the GPU computes with
//! (`strata_kernels::cuda::BlockFormat`) stay in device memory as the file's blocks when
//! asked (`--gguf-weights blocks`, and weights quantized at load); otherwise, and for other
//! block formats, they are decoded on upload to a dense bf16 matrix (2 bytes a weight).
//! bitsandbytes 4-bit matrices stay 4-bit (`CudaQuantMatrix::bnb4`, about 0.63 bytes a
//! weight) wherever their rows and blocks are whole 32-value runs.

use std::sync::Arc;

use half::bf16;
use strata_kernels::cuda::{BlockFormat, CudaBackend, CudaQuantMatrix};
use strata_kernels::{DType, HostSlice, MatrixShape, RowDot};

use crate::error::Result;
use crate::linear::{QuantUpload, QuantWeight};

impl QuantUpload for CudaBackend {
    fn upload_quant(&self, w: QuantWeight, dense: Option<DType>) -> Result<Arc<Self::QuantMatrix>> {
        let (rows, cols) = (w.rows(), w.cols());
        let format = BlockFormat::from_ggml_name(w.ggml_type().name());
        if let (Some(format), None) = (format, dense) {
            let m = CudaQuantMatrix::blocks(self, format, rows, cols, w.raw_bytes())?;
            return Ok(Arc::new(m));
        }
        let mut host = vec![bf16::ZERO; rows * cols];
        let mut row = vec![0.0f32; cols];
        for (r, out) in host.chunks_exact_mut(cols.max(1)).enumerate().take(rows) {
            // `QuantWeight::new` decoded a row already, so every row decodes here.
            w.dequant_row(r, &mut row);
            for (o, &v) in out.iter_mut().zip(&row) {
                *o = bf16::from_f32(v);
            }
        }
        let m = CudaQuantMatrix::upload(self, rows, cols, HostSlice::BF16(&host))?;
        Ok(Arc::new(m))
    }

    fn upload_bnb4(&self, w: crate::bnb4::Bnb4Weight) -> Result<Arc<Self::QuantMatrix>> {
        let (rows, cols) = (w.rows(), w.cols());
        // Kept 4-bit where every row and block is whole 32-value runs (the kernels' unit);
        // otherwise decoded to a dense matrix of the state's dtype.
        let round_to = match w.0.ty {
            strata_weights::GgmlType::BF16 => Some(DType::BF16),
            strata_weights::GgmlType::F16 => Some(DType::F16),
            strata_weights::GgmlType::F32 => Some(DType::F32),
            _ => None,
        };
        if let Some(round_to) =
            round_to.filter(|_| cols.is_multiple_of(32) && w.0.blocksize().is_multiple_of(32))
        {
            let parts = strata_kernels::cuda::Bnb4Parts {
                rows,
                cols,
                blocksize: w.0.blocksize(),
                codes: w.0.codes(),
                absmax: w.0.absmax(),
                quant_map: w.0.quant_map(),
                round_to,
            };
            return Ok(Arc::new(CudaQuantMatrix::bnb4(self, parts)?));
        }
        let mut values = vec![0f32; rows * cols];
        w.0.decode(0, &mut values);
        let m = match w.0.ty {
            strata_weights::GgmlType::BF16 => {
                let host: Vec<bf16> = values.iter().map(|&v| bf16::from_f32(v)).collect();
                CudaQuantMatrix::upload(self, rows, cols, HostSlice::BF16(&host))?
            }
            _ => CudaQuantMatrix::upload(self, rows, cols, HostSlice::F32(&values))?,
        };
        Ok(Arc::new(m))
    }

    fn quant_bytes(m: &Self::QuantMatrix) -> usize {
        m.device_bytes()
    }
}

/// The tiny transformers fixtures on the GPU: logits against the CPU backend and against
/// transformers, and greedy generation token for token equal to the CPU's. Each prints
/// `skipped: no GPU` and passes where no CUDA backend starts, unless `STRATA_REQUIRE_GPU`
/// is set (`strata_kernels::gpu_test`).
#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use strata_kernels::cpu::CpuBackend;
    use strata_kernels::sampling::{token_logprobs, TokenLogprobs};
    use strata_kernels::{Backend, DeviceBuffer};
    use strata_kv::{CacheType, HostStorage, KvCacheDtype, KvLayout, KvPool, KvStorage, PagePlan};

    use super::*;
    use crate::{
        DecodeGraphs, ForwardBatch, KvCache, Launched, LogitsMode, Model, PagedStorage,
        QuantUpload, SeqChunk, FED_TOKEN,
    };

    /// `$STRATA_TINY_FIXTURES` (for a copied tree on a GPU host), else the source tree's.
    fn fixtures() -> PathBuf {
        std::env::var_os("STRATA_TINY_FIXTURES")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny")
            })
    }

    /// One GPU model test at a time. Run in parallel, each on its own backend, they failed
    /// now and then: a cuBLAS launch on one thread (`CUBLAS_STATUS_EXECUTION_FAILED`) while
    /// another thread's decode graph capture was invalidated
    /// (`CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`), most likely a kernel module loaded lazily
    /// during the open capture. The engine captures on its one thread; several backends in
    /// one process capturing and launching at once, as these tests did, are what meet it.
    fn serial() -> std::sync::MutexGuard<'static, ()> {
        static GPU: std::sync::Mutex<()> = std::sync::Mutex::new(());
        GPU.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn gpu() -> Option<CudaBackend> {
        strata_kernels::gpu_test::gpu_or_skip(CudaBackend::new(0))
    }

    const PLAN: PagePlan = PagePlan {
        full: 64,
        window: 64,
        page_size: 4,
    };

    fn pool<B: Backend>(model: &Model<B>) -> KvPool<HostStorage> {
        host_pool(model, KvCacheDtype::F32)
    }

    fn host_pool<B: Backend>(model: &Model<B>, dtype: KvCacheDtype) -> KvPool<HostStorage> {
        let layout = KvLayout::for_config(model.config(), dtype).unwrap();
        KvPool::new(layout, PLAN, CacheType::Naive, HostStorage::new()).unwrap()
    }

    /// The device pool: slabs in GPU memory, paged attention.
    fn device_pool(
        model: &Model<CudaBackend>,
        dtype: KvCacheDtype,
    ) -> KvPool<PagedStorage<CudaBackend>> {
        let layout = KvLayout::for_config(model.config(), dtype).unwrap();
        let storage = PagedStorage::new(model.backend().clone());
        KvPool::new(layout, PLAN, CacheType::Naive, storage).unwrap()
    }

    /// Every position's logits for `ids` fed in chunks of the given sizes.
    fn logits<B: QuantUpload>(model: &Model<B>, ids: &[u32], chunks: &[usize]) -> Vec<f32> {
        logits_in(model, pool(model), ids, chunks)
    }

    fn logits_in<B: QuantUpload, S: KvStorage>(
        model: &Model<B>,
        kv: KvPool<S>,
        ids: &[u32],
        chunks: &[usize],
    ) -> Vec<f32>
    where
        KvPool<S>: KvCache<B>,
    {
        logits_as(model, kv, ids, chunks, LogitsMode::All)
    }

    /// The logits `mode` asks for of each chunk (every row, or the last).
    fn logits_as<B: QuantUpload, S: KvStorage>(
        model: &Model<B>,
        mut kv: KvPool<S>,
        ids: &[u32],
        chunks: &[usize],
        mode: LogitsMode,
    ) -> Vec<f32>
    where
        KvPool<S>: KvCache<B>,
    {
        let req = kv.alloc_request();
        let (mut out, mut start) = (Vec::new(), 0);
        for &n in chunks {
            kv.extend(req, n).unwrap();
            let batch = ForwardBatch {
                embeds: Vec::new(),
                seqs: vec![SeqChunk {
                    request: req,
                    tokens: ids[start..start + n].to_vec(),
                    start,
                    logits: mode,
                }],
                adjust: Vec::new(),
                masked: Vec::new(),
                adapters: Vec::new(),
            };
            out.extend(model.forward(&mut kv, &batch).unwrap().logits.remove(0));
            start += n;
        }
        out
    }

    /// Greedy decoding (ties to the lowest id), one token per step after the prompt.
    fn greedy<B: QuantUpload>(model: &Model<B>, prompt: &[u32], steps: usize) -> Vec<u32> {
        greedy_in(model, pool(model), prompt, steps)
    }

    fn greedy_in<B: QuantUpload, S: KvStorage>(
        model: &Model<B>,
        mut kv: KvPool<S>,
        prompt: &[u32],
        steps: usize,
    ) -> Vec<u32>
    where
        KvPool<S>: KvCache<B>,
    {
        let req = kv.alloc_request();
        let (mut tokens, mut fed) = (prompt.to_vec(), 0);
        for _ in 0..steps {
            let chunk = tokens[fed..].to_vec();
            kv.extend(req, chunk.len()).unwrap();
            let batch = ForwardBatch {
                embeds: Vec::new(),
                seqs: vec![SeqChunk {
                    request: req,
                    tokens: chunk.clone(),
                    start: fed,
                    logits: LogitsMode::Last,
                }],
                adjust: Vec::new(),
                masked: Vec::new(),
                adapters: Vec::new(),
            };
            let out = model.forward(&mut kv, &batch).unwrap();
            let last = out.last(0).unwrap();
            let best = (0..last.len()).fold(0, |b, i| if last[i] > last[b] { i } else { b });
            fed += chunk.len();
            tokens.push(best as u32);
        }
        tokens[prompt.len()..].to_vec()
    }

    fn reference(dir: &std::path::Path) -> (Vec<u32>, Vec<f32>) {
        let bytes = std::fs::read(dir.join("reference.safetensors")).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let ids_t = st.tensor("input_ids").unwrap();
        let ids = match ids_t.dtype() {
            safetensors::Dtype::I64 => ids_t
                .data()
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as u32)
                .collect(),
            _ => ids_t
                .data()
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as u32)
                .collect(),
        };
        let logits = st
            .tensor("logits")
            .unwrap()
            .data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        (ids, logits)
    }

    /// Values of `a` and `b` whose bits differ, position by position.
    fn bits_differing(a: &[f32], b: &[f32]) -> usize {
        a.iter()
            .zip(b)
            .filter(|(x, y)| x.to_bits() != y.to_bits())
            .count()
    }

    /// Asserts `got`'s top token equals `want`'s at every position (rows of `vocab`) where
    /// `want`'s best logit beats its runner-up by at least 0.5; returns how many there were.
    fn assert_decisive_top1(want: &[f32], got: &[f32], vocab: usize, name: &str) -> usize {
        let mut decisive = 0;
        for (p, (w, g)) in want.chunks(vocab).zip(got.chunks(vocab)).enumerate() {
            let mut order: Vec<usize> = (0..vocab).collect();
            order.sort_by(|&a, &b| w[b].total_cmp(&w[a]));
            if w[order[0]] - w[order[1]] < 0.5 {
                continue;
            }
            decisive += 1;
            let top = (0..vocab).max_by(|&a, &b| g[a].total_cmp(&g[b])).unwrap();
            assert_eq!(top, order[0], "{name}: position {p}'s top token");
        }
        decisive
    }

    fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
        assert_eq!(a.len(), b.len());
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max)
    }

    #[test]
    fn tiny_models_on_gpu_match_cpu_and_transformers() {
        let _serial = serial();
        let Some(_) = gpu() else { return };
        for name in [
            "gemma4-tiny",
            "gemma4-tiny-mm",
            "gemma3-tiny",
            "llama-tiny",
            "qwen3-tiny",
        ] {
            let dir = fixtures().join(name);
            let cpu = Model::load(CpuBackend::new(), &dir).unwrap();
            let cuda = Model::load(gpu().unwrap(), &dir).unwrap();
            let (ids, want) = reference(&dir);
            let n = ids.len();
            // One-pass prefill, then chunked prefill followed by single-token decode steps.
            let plans = [vec![n], {
                let mut v = vec![7, n - 13];
                v.extend([1; 6]);
                v
            }];
            for chunks in &plans {
                let on_cpu = logits(&cpu, &ids, chunks);
                let host_kv = logits(&cuda, &ids, chunks);
                let device_kv =
                    logits_in(&cuda, device_pool(&cuda, KvCacheDtype::F32), &ids, chunks);
                for (pool, on_gpu) in [("host pool", host_kv), ("device pool", device_kv)] {
                    let vs_cpu = max_abs_diff(&on_gpu, &on_cpu);
                    let vs_ref = max_abs_diff(&on_gpu, &want);
                    eprintln!(
                        "{name} {pool} chunks {chunks:?}: max |cuda - cpu| {vs_cpu:.3e}, \
                         max |cuda - transformers| {vs_ref:.3e}"
                    );
                    assert!(
                        vs_cpu < 1e-4,
                        "{name} {pool}: CUDA differs from CPU by {vs_cpu}"
                    );
                    assert!(
                        vs_ref < 1e-4,
                        "{name} {pool}: CUDA differs from transformers by {vs_ref}"
                    );
                }
            }
            // Each chunk's last row alone: Gemma-4's KV-shared layers then run that row
            // only (see `Model::set_kv_shared_trim`).
            let chunks = [5, 9, n - 17, 1, 1, 1];
            let ends: Vec<usize> = chunks
                .iter()
                .scan(0, |end, &c| {
                    *end += c;
                    Some(*end - 1)
                })
                .collect();
            let v = want.len() / n;
            let at_ends: Vec<f32> = ends
                .iter()
                .flat_map(|&e| want[e * v..(e + 1) * v].iter().copied())
                .collect();
            let pool = device_pool(&cuda, KvCacheDtype::F32);
            let last = logits_as(&cuda, pool, &ids, &chunks, LogitsMode::Last);
            let vs_ref = max_abs_diff(&last, &at_ends);
            eprintln!(
                "{name} device pool, last rows {ends:?}: max |cuda - transformers| {vs_ref:.3e}"
            );
            assert!(
                vs_ref < 1e-4,
                "{name} last rows: {vs_ref} from transformers"
            );
            // 8-bit and bf16 KV on the device pool against the CPU's host pool of the same
            // format: within the formats' stated bounds of transformers (see
            // tests/transformers_parity.rs), and close to the CPU.
            let gemma4 = name.starts_with("gemma4");
            for (dtype, bound) in [
                (KvCacheDtype::Bf16, if gemma4 { 0.3 } else { 0.03 }),
                (
                    KvCacheDtype::Int8PerTokenHead,
                    if gemma4 { 0.7 } else { 0.08 },
                ),
                (
                    KvCacheDtype::Fp8PerTokenHead,
                    if gemma4 { 2.0 } else { 0.4 },
                ),
            ] {
                let chunks = [n - 6, 1, 1, 1, 1, 1, 1];
                let on_gpu = logits_in(&cuda, device_pool(&cuda, dtype), &ids, &chunks);
                let on_cpu = logits_in(&cpu, host_pool(&cpu, dtype), &ids, &chunks);
                let (vs_cpu, vs_ref) =
                    (max_abs_diff(&on_gpu, &on_cpu), max_abs_diff(&on_gpu, &want));
                eprintln!("{name} device pool {dtype}: max |cuda - cpu| {vs_cpu:.3e}, max |cuda - transformers| {vs_ref:.3e}");
                assert!(
                    vs_ref < bound,
                    "{name} {dtype}: {vs_ref} from transformers (bound {bound})"
                );
            }
            let prompt = &ids[..8];
            let (g, c) = (greedy(&cuda, prompt, 16), greedy(&cpu, prompt, 16));
            let gd = greedy_in(&cuda, device_pool(&cuda, KvCacheDtype::F32), prompt, 16);
            assert_eq!(
                gd, c,
                "{name}: greedy tokens on the device pool differ (cpu {c:?})"
            );
            eprintln!("{name} greedy 16 after 8: cuda {g:?}");
            assert_eq!(g, c, "{name}: greedy tokens differ (cpu {c:?})");
        }
    }

    /// Three sequences of 5, 9 and 13 prompt tokens prefilled, then six decode steps of all
    /// three at once: every step's logits, and the decode graphs the pool captured.
    fn decode_three(
        cuda: &Model<CudaBackend>,
        ids: &[u32],
        mode: DecodeGraphs,
        dtype: KvCacheDtype,
    ) -> (Vec<f32>, usize) {
        let (out, graphs, _) = decode_steps(cuda, ids, mode, dtype, &[3; 6]);
        (out, graphs)
    }

    /// [`decode_three`]'s logits with the decode graph replayed, after checking that they
    /// are the bits of the same steps run op by op (one graph captured, bucket 4).
    fn replayed_as_unrecorded(cuda: &Model<CudaBackend>, ids: &[u32], name: &str) -> Vec<f32> {
        let (replayed, graphs) = decode_three(cuda, ids, DecodeGraphs::Replay, KvCacheDtype::F32);
        let (unrecorded, _) = decode_three(cuda, ids, DecodeGraphs::Unrecorded, KvCacheDtype::F32);
        assert_eq!(graphs, 1, "{name}: one bucket captured");
        let differing = bits_differing(&replayed, &unrecorded);
        assert_eq!(
            differing, 0,
            "{name}: replay differs from the op-by-op step"
        );
        replayed
    }

    /// Sequences of 5, 9, 13, 7 and 11 prompt tokens prefilled, then a decode step of the
    /// first `n` of them for each `n` of `schedule` (each teacher-forced from `ids`): every
    /// step's logits, and the decode graphs and logits buffers the pool holds at the end.
    fn decode_steps(
        cuda: &Model<CudaBackend>,
        ids: &[u32],
        mode: DecodeGraphs,
        dtype: KvCacheDtype,
        schedule: &[usize],
    ) -> (Vec<f32>, usize, usize) {
        decode_steps_with(cuda, ids, (mode, dtype), schedule, |_, _| 0)
    }

    /// [`decode_steps`] with sequence `i` of step `k` on LoRA adapter `adapter(k, i)`
    /// (0: none; prefills are step 0).
    fn decode_steps_with(
        cuda: &Model<CudaBackend>,
        ids: &[u32],
        (mode, dtype): (DecodeGraphs, KvCacheDtype),
        schedule: &[usize],
        adapter: impl Fn(usize, usize) -> u32,
    ) -> (Vec<f32>, usize, usize) {
        let mut kv = device_pool(cuda, dtype);
        kv.storage_mut().set_graph_mode(mode);
        let mut lens = [5usize, 9, 13, 7, 11];
        let wanted = schedule.iter().copied().max().unwrap_or(0);
        let reqs: Vec<_> = (0..wanted).map(|_| kv.alloc_request()).collect();
        for (i, (&r, &n)) in reqs.iter().zip(&lens).enumerate() {
            kv.extend(r, n).unwrap();
            let batch = ForwardBatch {
                embeds: Vec::new(),
                seqs: vec![SeqChunk {
                    request: r,
                    tokens: ids[..n].to_vec(),
                    start: 0,
                    logits: LogitsMode::None,
                }],
                adjust: Vec::new(),
                masked: Vec::new(),
                adapters: vec![adapter(0, i)],
            };
            cuda.forward(&mut kv, &batch).unwrap();
        }
        let mut out = Vec::new();
        for (k, &n) in schedule.iter().enumerate() {
            let seqs = reqs[..n]
                .iter()
                .zip(&mut lens)
                .map(|(&r, len)| {
                    kv.extend(r, 1).unwrap();
                    *len += 1;
                    SeqChunk {
                        request: r,
                        tokens: vec![ids[*len - 1]],
                        start: *len - 1,
                        logits: LogitsMode::Last,
                    }
                })
                .collect();
            let o = cuda
                .forward(
                    &mut kv,
                    &ForwardBatch {
                        embeds: Vec::new(),
                        seqs,
                        adjust: Vec::new(),
                        masked: Vec::new(),
                        adapters: (0..n).map(|i| adapter(k, i)).collect(),
                    },
                )
                .unwrap();
            for l in o.logits {
                out.extend(l);
            }
        }
        let st = kv.storage();
        let buffers = st.graph_logits.iter().flatten().count();
        (out, st.graph_count(), buffers)
    }

    /// Decode steps whose batch sizes move between buckets 1, 8 and 4: bucket 1's graph
    /// keeps its one-row logits buffer when bucket 8 needs a larger one, bucket 4's graph
    /// shares bucket 8's, and each is read at its own graph's row count. Every step's
    /// logits are the bits of the same padded step run op by op.
    /// peft's logits (`lora/<model>/reference.safetensors`, name `logits_<key>`).
    fn lora_reference(model: &str, key: &str) -> Vec<f32> {
        let path = fixtures()
            .join("lora")
            .join(model)
            .join("reference.safetensors");
        let bytes = std::fs::read(path).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let t = st.tensor(&format!("logits_{key}")).unwrap();
        t.data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    /// LoRA adapters on the GPU (op by op, room for two of three on the device): one step
    /// mixing every adapter the room allows and the base model, on the device pool, equals
    /// peft and the CPU backend within 2e-4 (exact f32 mode). The CPU is within 1e-4 of
    /// peft (4.7e-5 on gemma4-tiny all-r2); the GPU sums its f32 products in another order,
    /// and its first run gave 1.3e-4 from peft there: this bound was set after that run.
    #[test]
    fn lora_adapters_on_the_gpu_match_peft() {
        let _serial = serial();
        let Some(gpu) = gpu() else { return };
        let adapters = ["attn-r4", "mlp-r8-rs", "all-r2"];
        for name in ["gemma4-tiny", "llama-tiny"] {
            let dir = fixtures().join(name);
            let mut cuda = Model::load(gpu.clone(), &dir).unwrap();
            cuda.set_kv_shared_trim(false);
            cuda.set_max_resident_loras(2);
            let mut cpu = Model::load(CpuBackend::new(), &dir).unwrap();
            cpu.set_kv_shared_trim(false);
            for (i, a) in adapters.iter().enumerate() {
                let path = fixtures().join("lora").join(name).join(a);
                cuda.load_lora(i as u32 + 1, &path, 64).unwrap();
                cpu.load_lora(i as u32 + 1, &path, 64).unwrap();
            }
            let (ids, _) = reference(&dir);
            let n = ids.len();
            for pair in [[1u32, 2], [3, 1], [2, 3]] {
                let mut kv = device_pool(&cuda, KvCacheDtype::F32);
                let seqs = [pair[0], 0, pair[1]];
                let reqs: Vec<_> = seqs.iter().map(|_| kv.alloc_request()).collect();
                let mut batch = ForwardBatch {
                    adapters: seqs.to_vec(),
                    ..ForwardBatch::default()
                };
                for &r in &reqs {
                    kv.extend(r, n).unwrap();
                    batch.seqs.push(SeqChunk {
                        request: r,
                        tokens: ids.clone(),
                        start: 0,
                        logits: LogitsMode::All,
                    });
                }
                let out = cuda.forward(&mut kv, &batch).unwrap();
                let mut host = host_pool(&cpu, KvCacheDtype::F32);
                let mut on_cpu = batch.clone();
                for (seq, r) in on_cpu.seqs.iter_mut().zip(&reqs) {
                    let h = host.alloc_request();
                    host.extend(h, n).unwrap();
                    assert_eq!(h, *r, "both pools number requests alike");
                    seq.request = h;
                }
                let cpu_out = cpu.forward(&mut host, &on_cpu).unwrap();
                for ((&id, got), want_cpu) in seqs.iter().zip(&out.logits).zip(&cpu_out.logits) {
                    let key = if id == 0 {
                        "base"
                    } else {
                        adapters[id as usize - 1]
                    };
                    let d = max_abs_diff(got, &lora_reference(name, key));
                    let c = max_abs_diff(got, want_cpu);
                    eprintln!(
                        "{name} adapters {pair:?}: {key} max |cuda - peft| {d:.3e}, |cuda - cpu| {c:.3e}"
                    );
                    assert!(d < 2e-4, "{name} {key}: CUDA differs from peft by {d}");
                    assert!(c < 2e-4, "{name} {key}: CUDA differs from the CPU by {c}");
                }
            }
            assert!(cuda.lora_stats().uploads >= 4, "{:?}", cuda.lora_stats());
        }
    }

    /// bitsandbytes 4-bit checkpoints on the GPU (decoded to a dense matrix at upload): the
    /// reference ids' logits on the device pool within 1e-4 of transformers (on the same
    /// dequantized matrices) and of the CPU, whose matrices stay 4-bit.
    #[test]
    fn bitsandbytes_checkpoints_on_the_gpu_match_transformers() {
        let _serial = serial();
        let Some(gpu) = gpu() else { return };
        for variant in [
            "llama-tiny-nf4-dq",
            "llama-tiny-fp4",
            "gemma4-tiny-nf4-dq-bf16",
        ] {
            let dir = fixtures().join("bnb").join(variant);
            let (ids, want) = reference(&dir);
            let cuda = Model::load(gpu.clone(), &dir).unwrap();
            let cpu = Model::load(CpuBackend::new(), &dir).unwrap();
            let n = ids.len();
            let got = logits_in(&cuda, device_pool(&cuda, KvCacheDtype::F32), &ids, &[n]);
            let on_cpu = logits_in(&cpu, host_pool(&cpu, KvCacheDtype::F32), &ids, &[n]);
            let (d, c) = (max_abs_diff(&got, &want), max_abs_diff(&got, &on_cpu));
            eprintln!("{variant}: max |cuda - transformers| {d:.3e}, |cuda - cpu| {c:.3e}");
            assert!(d < 1e-4, "{variant}: CUDA differs from transformers by {d}");
            assert!(c < 1e-4, "{variant}: CUDA differs from the CPU by {c}");
        }
    }

    /// Decode steps mixing LoRA adapters replay as graphs: the rows' adapters change from
    /// step to step (slots are the graph's input), two slots for three adapters (so a
    /// step swaps one in), and every step's logits are the bits of the same padded step
    /// run op by op, and within 1e-4 of the plain op-by-op path (f32 KV), as plain decode
    /// graphs are.
    #[test]
    fn lora_decode_steps_replay_as_graphs() {
        let _serial = serial();
        let Some(gpu) = gpu() else { return };
        let adapters = ["attn-r4", "mlp-r8-rs", "all-r2"];
        // Step k, sequence i: rows move between adapters; at most two adapters a step.
        let plan = [
            [1, 0, 2],
            [2, 1, 0],
            [0, 3, 1],
            [3, 0, 0],
            [1, 1, 2],
            [0, 2, 3],
        ];
        let of = |k: usize, i: usize| plan[k.saturating_sub(1) % plan.len()][i];
        for name in ["gemma4-tiny", "llama-tiny"] {
            let dir = fixtures().join(name);
            let cuda = Model::load(gpu.clone(), &dir).unwrap();
            cuda.set_max_resident_loras(2);
            for (i, a) in adapters.iter().enumerate() {
                let path = fixtures().join("lora").join(name).join(a);
                cuda.load_lora(i as u32 + 1, &path, 64).unwrap();
            }
            let (ids, _) = reference(&dir);
            let sched = [3; 7];
            let run = |mode| decode_steps_with(&cuda, &ids, (mode, KvCacheDtype::F32), &sched, of);
            let (replayed, graphs, _) = run(DecodeGraphs::Replay);
            let (unrecorded, _, _) = run(DecodeGraphs::Unrecorded);
            let (eager, none, _) = run(DecodeGraphs::Off);
            assert!(
                graphs >= 1 && none == 0,
                "{name}: {graphs} graphs, {none} off"
            );
            let differing = bits_differing(&replayed, &unrecorded);
            let d = max_abs_diff(&replayed, &eager);
            eprintln!("{name}: LoRA graphs {graphs}, bits differing from op by op {differing}, max |replay - eager| {d:.3e}");
            assert_eq!(
                differing, 0,
                "{name}: replay differs from the op-by-op step"
            );
            assert!(
                d < 1e-4,
                "{name}: replay differs from the eager path by {d}"
            );
            // Against the adapters off: the products changed the logits.
            let (plain, _, _) =
                decode_steps(&cuda, &ids, DecodeGraphs::Replay, KvCacheDtype::F32, &sched);
            assert!(
                max_abs_diff(&replayed, &plain) > 1e-3,
                "{name}: adapters changed nothing"
            );
        }
    }

    #[test]
    fn decode_graphs_of_several_buckets_share_logits_buffers() {
        let _serial = serial();
        let Some(gpu) = gpu() else { return };
        let dir = fixtures().join("gemma4-tiny");
        let cuda = Model::load(gpu, &dir).unwrap();
        let (ids, _) = reference(&dir);
        let schedule = [1, 5, 3, 1, 3, 5, 1];
        let run = |mode| decode_steps(&cuda, &ids, mode, KvCacheDtype::Bf16, &schedule);
        let (unrecorded, none, _) = run(DecodeGraphs::Unrecorded);
        let (replayed, graphs, buffers) = run(DecodeGraphs::Replay);
        assert_eq!(none, 0, "the unrecorded mode captures nothing");
        assert_eq!(graphs, 3, "buckets 1, 4 and 8 held at the end");
        assert_eq!(
            buffers, 2,
            "bucket 1's buffer, and bucket 8's shared by bucket 4"
        );
        let rows: usize = schedule.iter().sum();
        assert_eq!(replayed.len(), rows * cuda.config().vocab_size);
        let differing = bits_differing(&unrecorded, &replayed);
        assert_eq!(
            (differing, unrecorded.len()),
            (0, replayed.len()),
            "replays differ from the same steps run op by op"
        );
    }

    /// The bf16 mode's three-row decode steps (bf16 weights; on sm_90 the few-row
    /// tensor-core GEMM takes the products whose k is a multiple of 64): a replayed graph
    /// gives the bits of the same step run op by op, and the logits, with the kernel and
    /// with cuBLAS's products in its place, stay within the bf16 bounds of the exact f32
    /// path's (f32 weights and KV); the bounds are the bf16 KV cache's above, since both
    /// round the same activations to bf16 once per product.
    #[test]
    fn bf16_mode_decode_rows_match_the_exact_path() {
        let _serial = serial();
        let Some(gpu) = gpu() else { return };
        let opts = crate::LoadOptions {
            weight_dtype: Some(strata_kernels::DType::BF16),
            ..Default::default()
        };
        for (name, bound) in [("gemma4-tiny", 0.3), ("llama-tiny", 0.03)] {
            let dir = fixtures().join(name);
            let (ids, _) = reference(&dir);
            let exact = Model::load(gpu.clone(), &dir).unwrap();
            let (want, _) = decode_three(&exact, &ids, DecodeGraphs::Replay, KvCacheDtype::F32);
            let load = |b: CudaBackend| Model::load_with(b, &dir, opts.clone()).unwrap();
            let fast = gpu.clone().with_bf16_gemm(true);
            let skinny = load(fast.clone());
            let cublas = load(fast.with_skinny_gemm(false));
            let replayed = replayed_as_unrecorded(&skinny, &ids, name);
            let (other, _) = decode_three(&cublas, &ids, DecodeGraphs::Replay, KvCacheDtype::F32);
            let (d_skinny, d_cublas) =
                (max_abs_diff(&replayed, &want), max_abs_diff(&other, &want));
            eprintln!(
                "{name}: bf16 mode vs the exact path: max |diff| {d_skinny:.3e} with the skinny \
                 GEMM ({}), {d_cublas:.3e} with cuBLAS; skinny vs cuBLAS {:.3e}",
                skinny.backend().skinny_gemm(),
                max_abs_diff(&replayed, &other)
            );
            assert!(
                d_skinny < bound,
                "{name}: skinny GEMM {d_skinny} from exact (bound {bound})"
            );
            assert!(
                d_cublas < bound,
                "{name}: cuBLAS {d_cublas} from exact (bound {bound})"
            );
        }
    }

    /// Weights quantized to Q8_0 at load (`LoadOptions::quantize`) stay blocks on the GPU
    /// (`quant_gemv_*` for the decode rows, the decoded path for the prompt): every
    /// position's logits, a prompt then single-token steps, against transformers' f32
    /// logits as `transformers_parity.rs` checks the CPU: the same top token wherever
    /// transformers' margin is at least 0.5, and a max difference within 8 times that of
    /// the model with its weights merely rounded to bf16 (on the CPU).
    #[test]
    fn weights_quantized_at_load_stay_blocks_and_close_to_transformers() {
        let _serial = serial();
        let Some(gpu) = gpu() else { return };
        let q8 = crate::LoadOptions {
            quantize: Some(strata_weights::GgmlType::Q8_0),
            ..Default::default()
        };
        let bf16 = crate::LoadOptions {
            weight_dtype: Some(strata_kernels::DType::BF16),
            ..Default::default()
        };
        let mut decisive = 0;
        for name in ["gemma3-tiny", "gemma4-tiny", "llama-tiny", "qwen3-tiny"] {
            let dir = fixtures().join(name);
            let (ids, want) = reference(&dir);
            let n = ids.len();
            let chunks = [n - 3, 1, 1, 1];
            let rounded = Model::load_with(CpuBackend::new(), &dir, bf16.clone()).unwrap();
            let cuda = Model::load_with(gpu.clone(), &dir, q8.clone()).unwrap();
            let (all, step) = cuda.weight_bytes();
            assert!(
                step > 0 && all >= step,
                "{name}: weight bytes {all} / {step}"
            );
            let got = logits(&cuda, &ids, &chunks);
            let d_bf16 = max_abs_diff(&logits(&rounded, &ids, &chunks), &want);
            let d = max_abs_diff(&got, &want);
            eprintln!("{name}: Q8_0 blocks on the GPU, max |diff| {d:.3e} (bf16 weights {d_bf16:.3e}), {all} weight bytes");
            assert!(
                d > 0.0 && d < 8.0 * d_bf16,
                "{name}: GPU Q8_0 max |diff| {d}"
            );
            decisive += assert_decisive_top1(&want, &got, cuda.config().vocab_size, name);
        }
        assert!(decisive > 0, "no decisive position in any fixture");
    }

    /// The vision tower as device ops on the GPU, from the same body as the CPU backend's
    /// test: f32 products within 1e-4 of transformers (relative to the largest value),
    /// bf16 products at a cosine of 0.999 or more.
    #[test]
    fn vision_tower_on_the_gpu_matches_transformers() {
        use crate::vision_device::check_against_transformers;
        use strata_kernels::DType;
        let _serial = serial();
        let Some(gpu) = gpu() else { return };
        let dir = fixtures().join("gemma4-tiny-vision");
        let (rel, _) =
            check_against_transformers(gpu.clone().with_bf16_gemm(false), &dir, DType::F32);
        assert!(rel < 1e-4, "f32: relative error {rel}");
        let (_, cos) = check_against_transformers(gpu.with_bf16_gemm(true), &dir, DType::BF16);
        assert!(cos >= 0.999, "bf16: cosine {cos}");
    }

    /// The audio tower as device ops on the GPU, from the same body as the CPU backend's
    /// test: f32 products within 1e-4 of transformers, bf16 products at a cosine of 0.999
    /// or more.
    #[test]
    fn audio_tower_on_the_gpu_matches_transformers() {
        use crate::audio_device::check_against_transformers;
        use strata_kernels::DType;
        let _serial = serial();
        let Some(gpu) = gpu() else { return };
        let dir = fixtures().join("gemma4-tiny-audio");
        let (t, s, _) =
            check_against_transformers(gpu.clone().with_bf16_gemm(false), &dir, DType::F32);
        assert!(t < 1e-4 && s < 1e-4, "f32: tower {t}, soft tokens {s}");
        let (_, _, cos) = check_against_transformers(gpu.with_bf16_gemm(true), &dir, DType::BF16);
        assert!(cos >= 0.999, "bf16: cosine {cos}");
    }

    /// E2B's audio tower at its real shape in bf16 against transformers f32 (cosine at least
    /// 0.999), with the time a clip takes; only with `STRATA_AUDIO_REAL_SHAPE` set (a
    /// directory written by scripts/bench/audio_encode.py: its clip's features and soft
    /// tokens).
    #[test]
    fn audio_tower_at_the_real_shape_matches_transformers() {
        use strata_kernels::DType;
        let _serial = serial();
        let Some(gpu) = gpu() else { return };
        let Some(dir) = std::env::var_os("STRATA_AUDIO_REAL_SHAPE") else {
            eprintln!("STRATA_AUDIO_REAL_SHAPE is not set: skipped");
            return;
        };
        let dir = std::path::PathBuf::from(dir);
        let tower = crate::AudioTower::load(&dir).unwrap().unwrap();
        let bins = tower.config().subsampling_channels[0];
        let device =
            crate::DeviceAudioTower::new(gpu.with_bf16_gemm(true), tower, DType::BF16).unwrap();
        let r = crate::reference_file::Reference::file(&dir.join("ref.safetensors"));
        let f32s = |name: &str| r.f32s(name);
        let (features, want) = (f32s("features"), f32s("soft"));
        let got = device.encode(&features, bins).unwrap();
        let mut times: Vec<f64> = (0..5)
            .map(|_| {
                let t = std::time::Instant::now();
                device.encode(&features, bins).unwrap();
                t.elapsed().as_secs_f64() * 1e3
            })
            .collect();
        times.sort_by(f64::total_cmp);
        let cos = crate::reference_file::cosine(&got.soft_tokens, &want);
        let seconds = (features.len() / bins) as f64 / 100.0;
        eprintln!(
            "audio real shape: {seconds} s ({} frames) -> {} soft tokens, cosine {cos:.6} to \
             transformers f32, {:.2} ms a clip ({:.2} ms a second of audio)",
            features.len() / bins,
            got.tokens,
            times[2],
            times[2] / seconds
        );
        assert!(cos >= 0.999, "cosine {cos}");
    }

    /// E2B's vision tower at its real shape in bf16 against transformers (cosine at least
    /// 0.999 to its f32 run), with the time an image takes; only with
    /// `STRATA_VISION_REAL_SHAPE` set (scripts/reference/vision_real_shape.py).
    #[test]
    fn vision_tower_at_the_real_shape_matches_transformers() {
        let _serial = serial();
        let Some(gpu) = gpu() else { return };
        let Some(rows) = crate::vision_device::check_real_shape(
            gpu.with_bf16_gemm(true),
            strata_kernels::DType::BF16,
        ) else {
            eprintln!("STRATA_VISION_REAL_SHAPE is not set: skipped");
            return;
        };
        assert!(!rows.is_empty());
        for (_, _, cos, _, _) in rows {
            assert!(cos >= 0.999, "cosine {cos}");
        }
    }

    /// A GGUF's blocks: decoded to bf16 at upload by default, kept as blocks on the
    /// device only with `keep_blocks` (`--gguf-weights blocks`); both pick the CPU's top
    /// token wherever the CPU's margin is at least 0.5, on the tiny Gemma-4 Q4_K_M file.
    #[test]
    fn gguf_blocks_stay_blocks_only_when_asked() {
        let _serial = serial();
        let Some(gpu) = gpu() else { return };
        let file = fixtures().join("../gguf-gemma4/gemma4-tiny-Q4_K_M.gguf");
        let load = |keep_blocks| {
            let o = crate::LoadOptions {
                keep_blocks,
                ..Default::default()
            };
            Model::load_with(gpu.clone(), &file, o).unwrap()
        };
        let (dense, blocks) = (load(false), load(true));
        let (d, b) = (dense.weight_bytes().1, blocks.weight_bytes().1);
        eprintln!("tiny Gemma-4 Q4_K_M: {d} weight bytes a step decoded, {b} as blocks");
        assert!(b * 2 < d, "blocks {b} bytes, decoded {d}");
        let cpu = Model::load_with(CpuBackend::new(), &file, Default::default()).unwrap();
        let ids: Vec<u32> = (0..24u32).map(|i| 2 + (i * 37) % 500).collect();
        let chunks = [21, 1, 1, 1];
        let want = logits(&cpu, &ids, &chunks);
        let vocab = cpu.config().vocab_size;
        let mut decisive = 0;
        for (name, model) in [("decoded", &dense), ("blocks", &blocks)] {
            let got = logits(model, &ids, &chunks);
            decisive += assert_decisive_top1(&want, &got, vocab, name);
        }
        assert!(decisive > 0, "no decisive position");
    }

    /// The o and down products split over k, their parts added by the residual norms
    /// (`Backend::matmul_parts`): with the skinny and small GEMMs off, the tiny models'
    /// products at 3 to 13 rows go to cuBLAS, and parts as short as their 16 inputs are
    /// allowed. A replayed graph equals its op-by-op step bit for bit; the logits stay
    /// within the bf16 mode's bound of the exact path, and close to the same steps run
    /// with whole products.
    #[test]
    fn products_split_over_k_match_whole_products() {
        use strata_kernels::cuda::KParts;
        let _serial = serial();
        let Some(gpu) = gpu() else { return };
        let opts = crate::LoadOptions {
            weight_dtype: Some(strata_kernels::DType::BF16),
            ..Default::default()
        };
        let short = KParts {
            min_rows: 3,
            max_rows: 128,
            min_part: 16,
        };
        for (name, bound) in [("gemma4-tiny", 0.3), ("llama-tiny", 0.03)] {
            let dir = fixtures().join(name);
            let (ids, _) = reference(&dir);
            let exact = Model::load(gpu.clone(), &dir).unwrap();
            let (want, _) = decode_three(&exact, &ids, DecodeGraphs::Replay, KvCacheDtype::F32);
            let cublas = gpu
                .clone()
                .with_bf16_gemm(true)
                .with_skinny_gemm(false)
                .with_small_gemm(false);
            let load = |b: CudaBackend| Model::load_with(b, &dir, opts.clone()).unwrap();
            let whole = load(cublas.clone().with_k_parts(KParts::OFF));
            let split = load(cublas.with_k_parts(short));
            let o = &split.tensors.layers[0].o;
            let crate::Linear::Dense { w, .. } = o else {
                panic!("{name}: a bf16 load keeps o dense")
            };
            let parts = split.backend().matmul_k_parts(w, o.shape(), 3);
            assert!(parts > 1, "{name}: o is not split at three rows");
            // A KV-shared layer's q goes to its head norm in parts as well.
            let shared = split.tensors.layers.iter().find(|lw| lw.k.is_none());
            assert_eq!(
                shared.is_some(),
                name == "gemma4-tiny",
                "{name}: KV-shared layers"
            );
            if let Some(shared) = shared {
                let crate::Linear::Dense { w, .. } = &shared.q else {
                    panic!("{name}: a bf16 load keeps q dense")
                };
                let q_parts = split.backend().matmul_k_parts(w, shared.q.shape(), 3);
                assert!(
                    q_parts > 1,
                    "{name}: a KV-shared q is not split at three rows"
                );
            }
            let replayed = replayed_as_unrecorded(&split, &ids, name);
            let (unsplit, _) = decode_three(&whole, &ids, DecodeGraphs::Replay, KvCacheDtype::F32);
            let (d_split, d_whole) = (
                max_abs_diff(&replayed, &want),
                max_abs_diff(&unsplit, &want),
            );
            let between = max_abs_diff(&replayed, &unsplit);
            eprintln!(
                "{name}: o in {parts} parts; from the exact path {d_split:.3e} split, \
                 {d_whole:.3e} whole; split vs whole {between:.3e}"
            );
            assert!(
                d_split < bound,
                "{name}: split {d_split} from exact (bound {bound})"
            );
            assert!(
                between <= 2.0 * d_whole.max(1e-4),
                "{name}: split vs whole {between} against whole's own {d_whole} from exact"
            );
        }
    }

    /// Decode steps of a batch of three sequences at different depths (bucket 4, one padded
    /// row). A replayed graph runs the same kernels on the same inputs as its padded step
    /// run op by op, so their logits must agree bit for bit. Against the plain op-by-op
    /// step, whose attention splits its keys by the batch's own depths, the logits differ in
    /// f32 summation order only: checked with an f32 KV cache, where nothing amplifies that.
    /// (With a bf16 cache a last-bit difference can move a stored K/V value by one bf16
    /// step, which the random tiny Gemma-4 moves later logits by ~1e-4; printed, not bounded.)
    #[test]
    fn decode_graphs_match_eager_steps() {
        let _serial = serial();
        let Some(_) = gpu() else { return };
        for name in ["gemma4-tiny", "llama-tiny"] {
            let dir = fixtures().join(name);
            let cuda = Model::load(gpu().unwrap(), &dir).unwrap();
            let (ids, _) = reference(&dir);
            let run = |mode, dtype| decode_three(&cuda, &ids, mode, dtype);
            let (unrecorded, none) = run(DecodeGraphs::Unrecorded, KvCacheDtype::Bf16);
            let (replayed, graphs) = run(DecodeGraphs::Replay, KvCacheDtype::Bf16);
            assert_eq!(none, 0, "{name}: the unrecorded mode captures nothing");
            assert_eq!(graphs, 1, "{name}: one bucket captured");
            let differing = bits_differing(&unrecorded, &replayed);
            let d = max_abs_diff(&unrecorded, &replayed);
            eprintln!("{name}: replayed vs unrecorded graph step: {differing} logits differ, max |diff| {d:.3e}");
            assert_eq!(
                (differing, unrecorded.len()),
                (0, replayed.len()),
                "{name}: replay differs from the same step run op by op (max {d})"
            );
            let (eager, _) = run(DecodeGraphs::Off, KvCacheDtype::F32);
            let (replayed_f32, _) = run(DecodeGraphs::Replay, KvCacheDtype::F32);
            let d = max_abs_diff(&eager, &replayed_f32);
            eprintln!("{name}: f32 KV, graphs vs op by op: max |diff| {d:.3e}");
            assert!(d < 1e-4, "{name}: graph replay differs by {d} (f32 KV)");
            let (eager_bf16, _) = run(DecodeGraphs::Off, KvCacheDtype::Bf16);
            let d = max_abs_diff(&eager_bf16, &replayed);
            eprintln!("{name}: bf16 KV, graphs vs op by op: max |diff| {d:.3e} (not bounded)");
        }
    }

    /// How the second of `three_streams`' sequences takes its tokens (the others are
    /// greedy).
    #[derive(Clone, Copy, PartialEq)]
    enum Second {
        Greedy,
        /// Drawn where the logits are (`LogitsMode::Draw`), with its logprobs.
        Drawn,
        /// Drawn on the host from its downloaded logits, with the same uniforms, and its
        /// logprobs taken there.
        DrawnOnHost,
    }

    /// Top logprobs the second sequence asks for when drawn.
    const TOP: usize = 5;

    /// Decoding of three sequences, each step's ids read back before the next is launched
    /// (`overlap` false) or the next step queued first with its ids fed from the previous
    /// step on the device: the token streams, the graphs captured, and the second
    /// sequence's logprobs when it is drawn.
    fn three_streams(
        cuda: &Model<CudaBackend>,
        ids: &[u32],
        mode: DecodeGraphs,
        overlap: bool,
        second: Second,
    ) -> (Vec<Vec<u32>>, usize, Vec<TokenLogprobs>) {
        let hot = strata_kernels::sampling::SamplingParams {
            temperature: 1.5,
            top_p: 0.97,
            ..Default::default()
        };
        let uniform = |step: usize| strata_kernels::sampling::draw_uniform(7, step as u64);
        let mut kv = device_pool(cuda, KvCacheDtype::Bf16);
        kv.storage_mut().set_graph_mode(mode);
        let reqs: Vec<_> = (0..3).map(|_| kv.alloc_request()).collect();
        let lens = [5usize, 9, 13];
        let mut next = vec![0u32; 3];
        let mut queued: Option<Launched<CudaBackend>> = None;
        let mut out = vec![Vec::new(); 3];
        let mut scores = Vec::new();
        let mut read = |step: Launched<CudaBackend>, next: &mut Vec<u32>| {
            let o = cuda.finish(step).unwrap();
            for (i, t) in o.tokens.iter().enumerate() {
                next[i] = t.unwrap_or_else(|| {
                    let u = uniform(out[i].len());
                    strata_kernels::sampling::sample(o.last(i).unwrap(), &hot, u).unwrap()
                });
                out[i].push(next[i]);
            }
            match second {
                Second::Drawn => scores.push(o.token_logprobs(1).unwrap().clone()),
                Second::DrawnOnHost => {
                    scores.push(token_logprobs(o.last(1).unwrap(), next[1], TOP))
                }
                Second::Greedy => {}
            }
        };
        for step in 0..7 {
            let seqs = reqs
                .iter()
                .zip(&lens)
                .enumerate()
                .map(|(i, (&r, &n))| {
                    let (tokens, start) = match step {
                        0 => (ids[..n].to_vec(), 0),
                        _ if queued.is_some() => (vec![FED_TOKEN | i as u32], n + step - 1),
                        _ => (vec![next[i]], n + step - 1),
                    };
                    kv.extend(r, tokens.len()).unwrap();
                    let logits = match (i, second) {
                        (1, Second::Drawn) => LogitsMode::Draw {
                            params: hot,
                            uniform: uniform(step),
                            logprobs: Some(TOP),
                        },
                        (1, Second::DrawnOnHost) => LogitsMode::Last,
                        _ => LogitsMode::Argmax,
                    };
                    SeqChunk {
                        request: r,
                        tokens,
                        start,
                        logits,
                    }
                })
                .collect();
            let launched = cuda
                .launch(
                    &mut kv,
                    &ForwardBatch {
                        embeds: Vec::new(),
                        seqs,
                        adjust: Vec::new(),
                        masked: Vec::new(),
                        adapters: Vec::new(),
                    },
                    queued.as_ref(),
                )
                .unwrap();
            if let Some(q) = queued.take() {
                read(q, &mut next);
            }
            if overlap {
                queued = Some(launched);
            } else {
                read(launched, &mut next);
            }
        }
        if let Some(q) = queued {
            read(q, &mut next);
        }
        (out, kv.storage().graph_count(), scores)
    }

    /// Decode steps queued before the one ahead of them is read, their ids fed from it on
    /// the GPU, give the same tokens as steps read one by one: replayed graphs (the first
    /// fed step captures its bucket), op-by-op steps, and the unrecorded graph mode.
    #[test]
    fn fed_decode_steps_match_steps_read_one_by_one() {
        let _serial = serial();
        each_tiny_model_and_graph_mode(|name, cuda, ids, mode| {
            let (plain, _, _) = three_streams(cuda, ids, mode, false, Second::Greedy);
            let (fed, graphs, _) = three_streams(cuda, ids, mode, true, Second::Greedy);
            eprintln!("{name} {mode:?}: {plain:?}");
            assert_eq!(fed, plain, "{name} {mode:?}");
            assert_eq!(graphs, usize::from(mode == DecodeGraphs::Replay), "{name}");
        });
    }

    /// Runs `f` for both tiny fixtures on the GPU (if there is one), in each decode graph
    /// mode, with the fixture's reference prompt.
    fn each_tiny_model_and_graph_mode(
        mut f: impl FnMut(&str, &Model<CudaBackend>, &[u32], DecodeGraphs),
    ) {
        let Some(_) = gpu() else { return };
        for name in ["gemma4-tiny", "llama-tiny"] {
            let dir = fixtures().join(name);
            let cuda = Model::load(gpu().unwrap(), &dir).unwrap();
            let (ids, _) = reference(&dir);
            for mode in [
                DecodeGraphs::Replay,
                DecodeGraphs::Off,
                DecodeGraphs::Unrecorded,
            ] {
                f(name, &cuda, &ids, mode);
            }
        }
    }

    /// A sequence drawn where the logits are, batched with greedy ones, gives the tokens and
    /// logprobs of the host's draw over its downloaded logits with the same uniforms: read
    /// one by one and fed from step to step, on replayed graphs, op by op and unrecorded.
    #[test]
    fn drawn_decode_steps_match_the_host_draw() {
        let _serial = serial();
        each_tiny_model_and_graph_mode(|name, cuda, ids, mode| {
            let (host, _, host_scores) = three_streams(cuda, ids, mode, false, Second::DrawnOnHost);
            let (greedy, _, _) = three_streams(cuda, ids, mode, false, Second::Greedy);
            for overlap in [false, true] {
                let (drawn, _, scores) = three_streams(cuda, ids, mode, overlap, Second::Drawn);
                eprintln!("{name} {mode:?} overlap {overlap}: {drawn:?}");
                assert_eq!(drawn, host, "{name} {mode:?} overlap {overlap}");
                assert_eq!(scores, host_scores, "{name} {mode:?} overlap {overlap}");
            }
            assert_ne!(host[1], greedy[1], "{name}: the draw never left the argmax");
        });
    }

    /// The tiny Gemma-4 target and its assistant on `b`.
    fn tiny_pair<B: QuantUpload + Clone>(b: B) -> (Model<B>, crate::Assistant<B>) {
        let dir = fixtures();
        let target = Model::load(b.clone(), &dir.join("gemma4-tiny")).unwrap();
        let asst = crate::Assistant::load(
            b,
            &dir.join("gemma4-tiny-assistant"),
            target.config(),
            crate::LoadOptions::default(),
        )
        .unwrap();
        (target, asst)
    }

    /// The tiny target's prompt, then three steps of its assistant: the target's greedy
    /// token and every draft, with the drafts' logits.
    fn three_drafts<B: QuantUpload + Clone, S: KvStorage>(
        b: B,
        kv: impl FnOnce(&Model<B>) -> KvPool<S>,
        ids: &[u32],
    ) -> (Vec<u32>, Vec<f32>)
    where
        KvPool<S>: KvCache<B>,
    {
        let (target, asst) = tiny_pair(b);
        let mut kv = kv(&target);
        let req = kv.alloc_request();
        kv.extend(req, ids.len()).unwrap();
        let batch = ForwardBatch {
            embeds: Vec::new(),
            seqs: vec![SeqChunk {
                request: req,
                tokens: ids.to_vec(),
                start: 0,
                logits: LogitsMode::Last,
            }],
            adjust: Vec::new(),
            masked: Vec::new(),
            adapters: Vec::new(),
        };
        let out = target.forward_greedy_rows(&mut kv, &batch).unwrap();
        let (mut token, mut hidden) = (out.tokens[0][0], out.hidden.unwrap());
        let (mut tokens, mut logits) = (vec![token], vec![]);
        let seq = crate::DraftSeq {
            request: req,
            position: ids.len(),
        };
        for _ in 0..3 {
            let d = asst
                .step(&target, &mut kv, &[seq], &[token], &hidden, true)
                .unwrap();
            token = d.tokens[0];
            tokens.push(token);
            logits.extend(d.logits.unwrap().remove(0));
            hidden = d.hidden;
        }
        (tokens, logits)
    }

    /// Draft rounds of three steps at two prompt lengths on the GPU's device pool, as
    /// captured graphs (the second round replays the first one's) or op by op.
    fn draft_rounds(ids: &[u32], graphs: bool) -> Vec<Vec<Vec<u32>>> {
        let (target, asst) = tiny_pair(gpu().unwrap());
        let mut kv = device_pool(&target, KvCacheDtype::F32);
        kv.storage_mut().set_graphs(graphs);
        let mut rounds = vec![];
        for len in [ids.len() - 3, ids.len()] {
            let req = kv.alloc_request();
            kv.extend(req, len).unwrap();
            let batch = ForwardBatch {
                embeds: Vec::new(),
                seqs: vec![SeqChunk {
                    request: req,
                    tokens: ids[..len].to_vec(),
                    start: 0,
                    logits: LogitsMode::Last,
                }],
                adjust: Vec::new(),
                masked: Vec::new(),
                adapters: Vec::new(),
            };
            let out = target.forward_greedy_rows(&mut kv, &batch).unwrap();
            let seq = crate::DraftSeq {
                request: req,
                position: len,
            };
            let (token, hidden) = (out.tokens[0][0], out.hidden.unwrap());
            let round = asst
                .draft(&target, &mut kv, &[seq], &[token], &hidden, 3)
                .unwrap();
            rounds.push(round);
            kv.release(req).unwrap();
        }
        assert_eq!(kv.storage().draft_graph_count(), usize::from(graphs));
        rounds
    }

    /// Three draft steps of the tiny assistant on the GPU (device pool) against the CPU in
    /// the same body and transformers' figures; then the target's verification of a run of
    /// tokens against its own decode steps, token by token.
    #[test]
    fn assistant_drafts_and_verification_on_gpu_match_cpu() {
        let _serial = serial();
        let Some(_) = gpu() else { return };
        let path = fixtures().join("gemma4-tiny-assistant/reference.safetensors");
        let bytes = std::fs::read(path).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let ints = |n: &str| -> Vec<u32> {
            let t = st.tensor(n).unwrap();
            let c = t.data().chunks_exact(8);
            c.map(|c| i64::from_le_bytes(c.try_into().unwrap()) as u32)
                .collect()
        };
        let floats = |n: &str| -> Vec<f32> {
            let t = st.tensor(n).unwrap();
            let c = t.data().chunks_exact(4);
            c.map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect()
        };
        let ids = ints("input_ids");
        let (gpu_tokens, gpu_logits) =
            three_drafts(gpu().unwrap(), |m| device_pool(m, KvCacheDtype::F32), &ids);
        let (cpu_tokens, cpu_logits) = three_drafts(CpuBackend::new(), pool, &ids);
        assert_eq!(gpu_tokens, cpu_tokens);
        assert_eq!(gpu_tokens[1..], ints("draft_tokens")[..]);
        // A round captured as a graph drafts what the steps op by op draft.
        let (captured, stepped) = (draft_rounds(&ids, true), draft_rounds(&ids, false));
        assert_eq!(captured, stepped, "draft rounds as graphs against op by op");
        let last: Vec<u32> = captured[1].iter().map(|s| s[0]).collect();
        assert_eq!(
            last,
            gpu_tokens[1..],
            "the captured round against single steps"
        );
        let vs_cpu = max_abs_diff(&gpu_logits, &cpu_logits);
        let vs_ref = max_abs_diff(&gpu_logits, &floats("draft_logits"));
        eprintln!("assistant drafts: max |cuda - cpu| {vs_cpu:.3e}, max |cuda - transformers| {vs_ref:.3e}");
        assert!(vs_cpu < 1e-4 && vs_ref < 1e-4, "{vs_cpu} {vs_ref}");

        // Verification: the greedy tokens of a run of tokens in one step are those of the
        // same tokens fed one step each (the graph-replayed decode path); the second run
        // replays the first one's graph at later positions.
        let cuda = Model::load(gpu().unwrap(), &fixtures().join("gemma4-tiny")).unwrap();
        let decoded = greedy_in(&cuda, device_pool(&cuda, KvCacheDtype::F32), &ids, 14);
        let mut kv = device_pool(&cuda, KvCacheDtype::F32);
        let req = kv.alloc_request();
        let mut all = ids.clone();
        all.extend_from_slice(&decoded);
        kv.extend(req, ids.len() - 1).unwrap();
        let prompt = ForwardBatch {
            embeds: Vec::new(),
            seqs: vec![SeqChunk {
                request: req,
                tokens: ids[..ids.len() - 1].to_vec(),
                start: 0,
                logits: LogitsMode::None,
            }],
            adjust: Vec::new(),
            masked: Vec::new(),
            adapters: Vec::new(),
        };
        cuda.forward(&mut kv, &prompt).unwrap();
        for run in 0..2 {
            let start = ids.len() - 1 + 6 * run;
            kv.extend(req, 6).unwrap();
            let verify = ForwardBatch {
                embeds: Vec::new(),
                seqs: vec![SeqChunk {
                    request: req,
                    tokens: all[start..start + 6].to_vec(),
                    start,
                    logits: LogitsMode::All,
                }],
                adjust: Vec::new(),
                masked: Vec::new(),
                adapters: Vec::new(),
            };
            let checked = cuda.forward_greedy_rows(&mut kv, &verify).unwrap();
            let want = &decoded[6 * run..6 * run + 6];
            assert_eq!(checked.tokens[0], want, "verification run {run}");
            assert_eq!(checked.hidden.unwrap().len(), 6 * cuda.config().hidden_size);
        }
        // One token a sequence with its state kept (a round that drafts nothing): a graph
        // of its own, beside the decode graph of the same shape.
        for j in 0..2 {
            let start = ids.len() - 1 + 12 + j;
            kv.extend(req, 1).unwrap();
            let verify = ForwardBatch {
                embeds: Vec::new(),
                seqs: vec![SeqChunk {
                    request: req,
                    tokens: vec![all[start]],
                    start,
                    logits: LogitsMode::All,
                }],
                adjust: Vec::new(),
                masked: Vec::new(),
                adapters: Vec::new(),
            };
            let checked = cuda.forward_greedy_rows(&mut kv, &verify).unwrap();
            assert_eq!(
                checked.tokens[0],
                [decoded[12 + j]],
                "one-token verification {j}"
            );
            assert_eq!(checked.hidden.unwrap().len(), cuda.config().hidden_size);
        }
        assert_eq!(
            kv.storage().graph_count(),
            2,
            "one verification graph for each run length, replayed"
        );
    }

    /// Three sequences drafting together (three is not a bucket): the round replays the
    /// four-sequence graph with a pad, twice (the second after another round's state), and
    /// drafts what the steps op by op draft.
    #[test]
    fn draft_rounds_of_a_count_between_buckets_replay_a_padded_graph() {
        let _serial = serial();
        let Some(_) = gpu() else { return };
        let (ids, _) = reference(&fixtures().join("gemma4-tiny"));
        let rounds = |graphs: bool| -> (Vec<Vec<Vec<u32>>>, usize) {
            let (target, asst) = tiny_pair(gpu().unwrap());
            let mut kv = device_pool(&target, KvCacheDtype::F32);
            kv.storage_mut().set_graphs(graphs);
            let prompts: Vec<Vec<u32>> = (0..3)
                .map(|r| ids.iter().map(|&t| (t + 13 * r as u32) % 200 + 3).collect())
                .collect();
            let reqs: Vec<_> = prompts.iter().map(|_| kv.alloc_request()).collect();
            for (&req, p) in reqs.iter().zip(&prompts) {
                kv.extend(req, p.len()).unwrap();
            }
            let batch = ForwardBatch {
                embeds: Vec::new(),
                seqs: reqs
                    .iter()
                    .zip(&prompts)
                    .map(|(&request, p)| SeqChunk {
                        request,
                        tokens: p.clone(),
                        start: 0,
                        logits: LogitsMode::Last,
                    })
                    .collect(),
                adjust: Vec::new(),
                masked: Vec::new(),
                adapters: Vec::new(),
            };
            let out = target.forward_greedy_rows(&mut kv, &batch).unwrap();
            let seqs: Vec<crate::DraftSeq> = reqs
                .iter()
                .zip(&prompts)
                .map(|(&request, p)| crate::DraftSeq {
                    request,
                    position: p.len(),
                })
                .collect();
            let tokens: Vec<u32> = out.tokens.iter().map(|t| t[0]).collect();
            let hidden = out.hidden.unwrap();
            let mut drafted = Vec::new();
            for _ in 0..2 {
                drafted.push(
                    asst.draft(&target, &mut kv, &seqs, &tokens, &hidden, 3)
                        .unwrap(),
                );
            }
            (drafted, kv.storage().draft_graph_count())
        };
        let (replayed, graphs) = rounds(true);
        let (stepped, none) = rounds(false);
        assert_eq!((graphs, none), (1, 0), "one padded draft graph, replayed");
        assert_eq!(replayed, stepped, "padded draft rounds against op by op");
        assert!(replayed
            .iter()
            .all(|r| r.len() == 3 && r.iter().all(|s| s.len() == 3)));
    }

    /// Three sequences verifying three tokens each (three is not a bucket): the step replays
    /// the four-sequence graph with a pad of three tokens on the spare page, twice (the
    /// second at later positions, with another sequence's tokens), and every row's token is
    /// the step's op by op.
    #[test]
    fn verification_of_a_count_between_buckets_replays_a_padded_graph() {
        let _serial = serial();
        let Some(_) = gpu() else { return };
        let cuda = Model::load(gpu().unwrap(), &fixtures().join("gemma4-tiny")).unwrap();
        let (ids, _) = reference(&fixtures().join("gemma4-tiny"));
        let rounds = |mode: DecodeGraphs| -> (Vec<Vec<Vec<u32>>>, usize) {
            let mut kv = device_pool(&cuda, KvCacheDtype::F32);
            kv.storage_mut().set_graph_mode(mode);
            let prompts: Vec<Vec<u32>> = (0..3)
                .map(|r| ids.iter().map(|&t| (t + 7 * r as u32) % 200 + 3).collect())
                .collect();
            let reqs: Vec<_> = prompts.iter().map(|_| kv.alloc_request()).collect();
            for (&req, p) in reqs.iter().zip(&prompts) {
                kv.extend(req, p.len()).unwrap();
            }
            let prompt = ForwardBatch {
                embeds: Vec::new(),
                seqs: reqs
                    .iter()
                    .zip(&prompts)
                    .map(|(&request, p)| SeqChunk {
                        request,
                        tokens: p.clone(),
                        start: 0,
                        logits: LogitsMode::None,
                    })
                    .collect(),
                adjust: Vec::new(),
                masked: Vec::new(),
                adapters: Vec::new(),
            };
            cuda.forward(&mut kv, &prompt).unwrap();
            let mut out = Vec::new();
            for round in 0..2 {
                let seqs = reqs
                    .iter()
                    .zip(&prompts)
                    .enumerate()
                    .map(|(i, (&request, p))| {
                        kv.extend(request, 3).unwrap();
                        SeqChunk {
                            request,
                            tokens: (0..3)
                                .map(|j| (11 * i + 5 * j + round) as u32 + 9)
                                .collect(),
                            start: p.len() + 3 * round,
                            logits: LogitsMode::All,
                        }
                    })
                    .collect();
                let checked = cuda
                    .forward_greedy_rows(
                        &mut kv,
                        &ForwardBatch {
                            embeds: Vec::new(),
                            seqs,
                            adjust: Vec::new(),
                            masked: Vec::new(),
                            adapters: Vec::new(),
                        },
                    )
                    .unwrap();
                assert_eq!(checked.hidden.unwrap().len(), 9 * cuda.config().hidden_size);
                out.push(checked.tokens);
            }
            (out, kv.storage().graph_count())
        };
        let (replayed, graphs) = rounds(DecodeGraphs::Replay);
        let (stepped, none) = rounds(DecodeGraphs::Off);
        assert_eq!(
            (graphs, none),
            (1, 0),
            "one padded verification graph, replayed"
        );
        assert_eq!(replayed, stepped, "padded graph against op by op");
    }
}
