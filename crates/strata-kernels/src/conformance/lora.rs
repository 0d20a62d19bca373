//! LoRA products by slot ([`Backend::lora_bgmv`]).

use super::{compare, ctx, get, put, CheckResult, TestData, Tolerance};
use crate::{lora_slot_index, Backend, DType, LoraOut, LoraShape, LoraStacks};

/// One check: `shape`'s stacks in `dtype`, each row's slot drawn from the stacks' or none.
#[derive(Clone, Copy, Debug)]
pub struct LoraCase {
    /// Rows, slots, rank and features.
    pub shape: LoraShape,
    /// The stacks' dtype (F32 or BF16).
    pub dtype: DType,
    /// Seed of the inputs and of the rows' slots.
    pub seed: u64,
}

fn cases() -> Vec<LoraCase> {
    let shapes = [
        (1, 1, 8, 64, 96),
        (5, 3, 16, 200, 130),
        (9, 4, 32, 300, 257),
        // E2B's q projection at rank 32 and the down projection's wide input.
        (3, 2, 32, 1536, 2048),
        (2, 2, 16, 6144, 1536),
        // Past the expand's register rank, an odd rank, and more rows than one block's.
        (3, 2, 80, 96, 70),
        (4, 3, 5, 40, 33),
        (19, 4, 8, 64, 300),
        // Tiles that span slots once the rows are sorted, some rows without an adapter.
        (37, 3, 32, 264, 96),
    ];
    let mut out = Vec::new();
    for (i, &(rows, slots, rank, cols, out_f)) in shapes.iter().enumerate() {
        for (j, dtype) in [DType::F32, DType::BF16].into_iter().enumerate() {
            out.push(LoraCase {
                shape: LoraShape {
                    rows,
                    slots,
                    rank,
                    cols,
                    out: out_f,
                },
                dtype,
                seed: 900 + 10 * i as u64 + j as u64,
            });
        }
    }
    out
}

/// [`Backend::lora_bgmv`] on case `c` against the f64 definition: rows without a slot keep
/// their values exactly.
pub fn check_lora_bgmv_case<B: Backend>(b: &B, c: LoraCase) -> CheckResult {
    let s = c.shape;
    let dt = b.activation_dtype();
    let mut data = TestData::new(c.seed);
    let x = data.normals(s.rows * s.cols, 1.0, dt);
    let a = data.normals(s.slots * s.rank * s.cols, 0.05, c.dtype);
    let bm = data.normals(s.slots * s.out * s.rank, 0.05, c.dtype);
    let before = data.normals(s.rows * s.out, 1.0, dt);
    let scales: Vec<f32> = (0..s.slots).map(|i| 0.5 + i as f32 * 0.75).collect();
    // Row 0 takes the last slot, so every case reads the stacks' ends; then any slot or none.
    let slots: Vec<u32> = (0..s.rows)
        .map(|r| match r {
            0 => s.slots as u32 - 1,
            _ => match data.below(s.slots + 1) {
                n if n == s.slots => u32::MAX,
                n => n as u32,
            },
        })
        .collect();
    let what = format!("lora_bgmv {c:?}");
    let mut out = put(b, &before, dt)?;
    ctx(
        &what,
        b.lora_bgmv(
            &put(b, &x, dt)?,
            LoraStacks {
                a: &put(b, &a, c.dtype)?,
                b: &put(b, &bm, c.dtype)?,
                scales: &put(b, &scales, DType::F32)?,
            },
            &ctx(&what, b.upload_index(&lora_slot_index(&slots)))?,
            s,
            &mut out,
        ),
    )?;
    let mut want = Vec::with_capacity(s.rows * s.out);
    let mut mag = Vec::with_capacity(s.rows * s.out);
    for (r, &slot) in slots.iter().enumerate() {
        let o = &before[r * s.out..(r + 1) * s.out];
        if slot == u32::MAX {
            want.extend(o.iter().map(|&v| v as f64));
            mag.extend(std::iter::repeat_n(0.0, s.out));
            continue;
        }
        let (sl, xr) = (slot as usize, &x[r * s.cols..(r + 1) * s.cols]);
        let (mut h, mut hm) = (vec![0f64; s.rank], vec![0f64; s.rank]);
        for k in 0..s.rank {
            let ak = &a[(sl * s.rank + k) * s.cols..][..s.cols];
            for (&w, &v) in ak.iter().zip(xr) {
                h[k] += w as f64 * v as f64;
                hm[k] += (w as f64 * v as f64).abs();
            }
        }
        for (j, &oj) in o.iter().enumerate() {
            let bj = &bm[(sl * s.out + j) * s.rank..][..s.rank];
            let (mut y, mut m) = (0.0, 0.0);
            for k in 0..s.rank {
                y += bj[k] as f64 * h[k];
                m += (bj[k] as f64).abs() * hm[k];
            }
            let scale = scales[sl] as f64;
            want.push(oj as f64 + scale * y);
            mag.push((oj as f64).abs() + scale * m);
        }
    }
    compare(&what, &get(b, &out)?, &want, &mag, Tolerance::for_dtype(dt))
}

/// A row's product does not depend on the rows beside it: each row of a mixed step, run
/// alone, gives the same bits (a backend may tile rows by slot, never mix their sums).
fn check_rows_alone<B: Backend>(b: &B) -> CheckResult {
    let s = LoraShape {
        rows: 21,
        slots: 3,
        rank: 16,
        cols: 136,
        out: 72,
    };
    let dt = b.activation_dtype();
    let mut data = TestData::new(977);
    let x = data.normals(s.rows * s.cols, 1.0, dt);
    let a = put(b, &data.normals(s.slots * s.rank * s.cols, 0.05, dt), dt)?;
    let bm = put(b, &data.normals(s.slots * s.out * s.rank, 0.05, dt), dt)?;
    let scales = put(b, &[0.5, 1.0, 2.0], DType::F32)?;
    let stacks = LoraStacks {
        a: &a,
        b: &bm,
        scales: &scales,
    };
    let slots: Vec<u32> = (0..s.rows as u32)
        .map(|r| if r % 5 == 4 { u32::MAX } else { r * 7 % 3 })
        .collect();
    let what = "lora_bgmv rows alone";
    let mut all = put(b, &vec![0.0; s.rows * s.out], dt)?;
    let index = ctx(what, b.upload_index(&lora_slot_index(&slots)))?;
    ctx(
        what,
        b.lora_bgmv(&put(b, &x, dt)?, stacks, &index, s, &mut all),
    )?;
    let all = get(b, &all)?;
    for r in 0..s.rows {
        let one = LoraShape { rows: 1, ..s };
        let mut out = put(b, &vec![0.0; s.out], dt)?;
        let xr = put(b, &x[r * s.cols..(r + 1) * s.cols], dt)?;
        let index = ctx(what, b.upload_index(&lora_slot_index(&slots[r..r + 1])))?;
        ctx(what, b.lora_bgmv(&xr, stacks, &index, one, &mut out))?;
        let got = get(b, &out)?;
        let want = &all[r * s.out..(r + 1) * s.out];
        if got
            .iter()
            .zip(want)
            .any(|(g, w)| g.to_bits() != w.to_bits())
        {
            return Err(format!(
                "{what}: row {r} alone differs from the same row in the step"
            ));
        }
    }
    Ok(())
}

/// [`Backend::lora_bgmv`] over every case, that a row's result does not depend on the
/// others, and that it refuses stacks of the wrong size.
pub fn check_lora_bgmv<B: Backend>(b: &B) -> CheckResult {
    for c in cases() {
        check_lora_bgmv_case(b, c)?;
    }
    check_rows_alone(b)?;
    let dt = b.activation_dtype();
    let shape = LoraShape {
        rows: 1,
        slots: 1,
        rank: 2,
        cols: 3,
        out: 2,
    };
    let mut out = put(b, &[0.0; 2], dt)?;
    let short = put(b, &[0.0; 5], DType::F32)?;
    let fine = put(b, &[0.0; 4], DType::F32)?;
    let scale = put(b, &[1.0], DType::F32)?;
    let slots = ctx("lora_bgmv refusal", b.upload_index(&[0, 0, 0]))?;
    let stacks = LoraStacks {
        a: &short,
        b: &fine,
        scales: &scale,
    };
    match b.lora_bgmv(&put(b, &[0.0; 3], dt)?, stacks, &slots, shape, &mut out) {
        Err(_) => Ok(()),
        Ok(()) => Err("lora_bgmv: an A stack of 5 values for [1, 2, 3] was taken".into()),
    }
}

/// [`Backend::lora_bgmv_shared_input`]: four parts of different output sizes over one x
/// (more than one launch takes on CUDA) give each part the bits [`Backend::lora_bgmv`]
/// gives it alone, which `check_lora_bgmv` checks against the definition.
pub fn check_lora_shared_input<B: Backend>(b: &B) -> CheckResult {
    let s = LoraShape {
        rows: 11,
        slots: 2,
        rank: 16,
        cols: 200,
        out: 0,
    };
    let outs = [96, 40, 300, 8];
    let dt = b.activation_dtype();
    let mut data = TestData::new(991);
    let x = put(b, &data.normals(s.rows * s.cols, 1.0, dt), dt)?;
    let a: Vec<_> = outs
        .iter()
        .map(|_| put(b, &data.normals(s.slots * s.rank * s.cols, 0.05, dt), dt))
        .collect::<Result<_, _>>()?;
    let bm: Vec<_> = outs
        .iter()
        .map(|&o| put(b, &data.normals(s.slots * o * s.rank, 0.05, dt), dt))
        .collect::<Result<_, _>>()?;
    let scales = put(b, &[0.5, 2.0], DType::F32)?;
    let before: Vec<Vec<f32>> = outs
        .iter()
        .map(|&o| data.normals(s.rows * o, 1.0, dt))
        .collect();
    let slots: Vec<u32> = (0..s.rows as u32)
        .map(|r| if r % 4 == 3 { u32::MAX } else { r % 2 })
        .collect();
    let what = "lora_bgmv_shared_input";
    let index = ctx(what, b.upload_index(&lora_slot_index(&slots)))?;
    let stacks = |i: usize| LoraStacks {
        a: &a[i],
        b: &bm[i],
        scales: &scales,
    };
    let mut shared: Vec<_> = before
        .iter()
        .map(|v| put(b, v, dt))
        .collect::<Result<_, _>>()?;
    {
        let mut parts: Vec<LoraOut<'_, B::Buffer>> = shared
            .iter_mut()
            .enumerate()
            .map(|(i, out)| LoraOut {
                stacks: stacks(i),
                out_features: outs[i],
                out,
            })
            .collect();
        ctx(what, b.lora_bgmv_shared_input(&x, &mut parts, &index, s))?;
    }
    for (i, &o) in outs.iter().enumerate() {
        let mut alone = put(b, &before[i], dt)?;
        let one = LoraShape { out: o, ..s };
        ctx(what, b.lora_bgmv(&x, stacks(i), &index, one, &mut alone))?;
        let (got, want) = (get(b, &shared[i])?, get(b, &alone)?);
        if got
            .iter()
            .zip(&want)
            .any(|(g, w)| g.to_bits() != w.to_bits())
        {
            return Err(format!("{what}: part {i} differs from lora_bgmv alone"));
        }
        if got == before[i] {
            return Err(format!("{what}: part {i} was left as it was"));
        }
    }
    Ok(())
}
