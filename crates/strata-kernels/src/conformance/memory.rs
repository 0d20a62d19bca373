//! Upload / download round trips and strided copies.

use super::{ctx, get, put, CheckResult, TestData};
use crate::{Backend, DType, DeviceBuffer, StridedCopy};

/// `upload` then `download` of each dtype at lengths 0, 1 and 1000 returns the values
/// exactly with the right length and dtype, and `zeros` downloads as zeros.
pub fn check_upload_download<B: Backend>(b: &B) -> CheckResult {
    let mut data = TestData::new(700);
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        for len in [0, 1, 1000] {
            let x = data.normals(len, 3.0, dtype);
            let buf = put(b, &x, dtype)?;
            if buf.len() != len || buf.dtype() != dtype {
                return Err(format!(
                    "upload {dtype:?}: got len {} dtype {:?}",
                    buf.len(),
                    buf.dtype()
                ));
            }
            if get(b, &buf)? != x {
                return Err(format!("upload/download {dtype:?} x {len} is not exact"));
            }
        }
        let z = ctx("zeros", b.zeros(17, dtype))?;
        if get(b, &z)? != vec![0.0; 17] {
            return Err(format!("zeros {dtype:?} not zero"));
        }
    }
    Ok(())
}

/// Splits a fused `[T, q | k | v]` projection into its parts and checks them exactly.
pub fn check_copy_strided<B: Backend>(b: &B) -> CheckResult {
    let act = b.activation_dtype();
    let (t, nq, nk) = (5, 12, 4);
    let row = nq + 2 * nk;
    let fused = TestData::new(701).normals(t * row, 1.0, act);
    let src = put(b, &fused, act)?;
    for (offset, cols) in [(0, nq), (nq, nk), (nq + nk, nk)] {
        let mut dst = ctx("copy_strided", b.zeros(t * cols, act))?;
        let c = StridedCopy {
            rows: t,
            cols,
            src_offset: offset,
            src_stride: row,
            dst_offset: 0,
            dst_stride: cols,
        };
        ctx("copy_strided", b.copy_strided(&src, &mut dst, c))?;
        let want: Vec<f32> = fused
            .chunks(row)
            .flat_map(|r| r[offset..offset + cols].iter().copied())
            .collect();
        if get(b, &dst)? != want {
            return Err(format!("copy_strided {c:?}: wrong values"));
        }
    }
    let mut small = ctx("copy_strided", b.zeros(3, act))?;
    let too_far = StridedCopy {
        rows: 2,
        cols: 2,
        src_offset: 0,
        src_stride: 2,
        dst_offset: 0,
        dst_stride: 2,
    };
    if b.copy_strided(&src, &mut small, too_far).is_ok() {
        return Err("copy_strided wrote past the end of its destination".into());
    }
    Ok(())
}
