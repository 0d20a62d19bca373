//! A weight update: another copy of a model's weights (a new checkpoint of the same shapes)
//! takes the served one's place, with the adapters loaded so far. And what checks that a
//! refresh restores the weights exactly: a digest of each tensor, and a perturbation.

use strata_kernels::Backend;

use crate::error::{ModelError, Result};
use crate::linear::Linear;
use crate::tensors::ModelTensors;
use crate::Model;

impl<B: Backend> Model<B> {
    /// Refuses `other` as this model's replacement unless its configuration and every
    /// matrix's shape are this model's (so the pool, graphs' shapes and adapters fit it).
    pub fn check_same_shapes(&self, other: &Model<B>) -> Result<()> {
        if self.config != other.config {
            return Err(ModelError::Invalid(
                "the new weights' configuration differs from the served model's".into(),
            ));
        }
        let shapes = |t: &ModelTensors<B>| -> Vec<(usize, usize)> {
            t.matrices().iter().map(|m| (m.rows(), m.cols())).collect()
        };
        match shapes(&self.tensors) == shapes(&other.tensors) {
            true => Ok(()),
            false => Err(ModelError::Invalid(
                "the new weights' matrices differ in shape from the served model's".into(),
            )),
        }
    }

    /// Moves the adapters `from` has loaded into this model (a model replacing `from`).
    pub fn adopt_loras(&self, from: &Model<B>) {
        self.loras.adopt(&from.loras);
    }

    /// A 64-bit digest (FNV-1a over the f32 bits as read back) of every matrix and norm
    /// weight, in a fixed order: equal digests mean bit-identical weights. Refused for
    /// block-quantized or host-resident matrices, which cannot be read back.
    pub fn weight_digests(&self) -> Result<Vec<u64>> {
        let t = &self.tensors;
        let mut tensors = Vec::new();
        for m in t.matrices() {
            match m {
                Linear::Dense { w, .. } => tensors.push(w),
                _ => {
                    return Err(ModelError::Invalid(
                        "a matrix is block-quantized or in host memory: only dense weights are \
                         compared"
                            .into(),
                    ))
                }
            }
        }
        for l in &t.layers {
            tensors.extend([&l.input_norm, &l.pre_mlp_norm]);
            tensors.extend(l.post_attn_norm.iter().chain(&l.post_mlp_norm));
        }
        tensors.push(&t.final_norm);
        tensors
            .into_iter()
            .map(|buf| {
                let values = self.backend.download(buf)?;
                let mut h: u64 = 0xcbf2_9ce4_8422_2325;
                for v in values {
                    for byte in v.to_bits().to_le_bytes() {
                        h ^= u64::from(byte);
                        h = h.wrapping_mul(0x0100_0000_01b3);
                    }
                }
                Ok(h)
            })
            .collect()
    }

    /// Multiplies every dense matrix by `factor`, in place (what a training step's update
    /// does to the served copy, for the drift check).
    pub fn perturb_weights(&mut self, factor: f32) -> Result<()> {
        let (b, t) = (&self.backend, &mut self.tensors);
        let mut mats: Vec<&mut Linear<B>> = vec![&mut t.embed];
        mats.extend(t.lm_head.as_mut());
        for l in &mut t.layers {
            mats.extend([&mut l.q, &mut l.o, &mut l.gate, &mut l.up, &mut l.down]);
            mats.extend(l.k.as_mut());
            mats.extend(l.v.as_mut());
            if let Some((g, p, _)) = &mut l.ple {
                mats.extend([g, p]);
            }
        }
        if let Some(p) = &mut t.ple {
            mats.extend([&mut p.table, &mut p.projection]);
        }
        for m in mats {
            if let Linear::Dense { w, .. } = m {
                b.scale(w, factor)?;
            }
        }
        Ok(())
    }
}
