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
            let mut v = vec![(t.embed.rows(), t.embed.cols())];
            for l in &t.layers {
                let mats = [Some(&l.q), l.k.as_ref(), l.v.as_ref(), Some(&l.o)];
                let more = [Some(&l.gate), Some(&l.up), Some(&l.down)];
                v.extend(
                    mats.into_iter()
                        .chain(more)
                        .flatten()
                        .map(|m| (m.rows(), m.cols())),
                );
            }
            v
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

    /// Every dense tensor by name, in a fixed order; refused for block-quantized or
    /// host-resident matrices, which a digest cannot read back.
    fn dense(&self) -> Result<Vec<(String, &B::Buffer)>> {
        let mut out: Vec<(String, &B::Buffer)> = Vec::new();
        let t = &self.tensors;
        fn push_dense<'a, B: Backend>(
            out: &mut Vec<(String, &'a B::Buffer)>,
            name: String,
            m: &'a Linear<B>,
        ) -> Result<()> {
            match m {
                Linear::Dense { w, .. } => {
                    out.push((name, w));
                    Ok(())
                }
                _ => Err(ModelError::Invalid(format!(
                    "{name} is block-quantized or in host memory: only dense weights are compared"
                ))),
            }
        }
        push_dense(&mut out, "embed".into(), &t.embed)?;
        if let Some(h) = &t.lm_head {
            push_dense(&mut out, "lm_head".into(), h)?;
        }
        for (i, l) in t.layers.iter().enumerate() {
            let mats = [
                ("q", Some(&l.q)),
                ("k", l.k.as_ref()),
                ("v", l.v.as_ref()),
                ("o", Some(&l.o)),
                ("gate", Some(&l.gate)),
                ("up", Some(&l.up)),
                ("down", Some(&l.down)),
            ];
            for (n, m) in mats {
                if let Some(m) = m {
                    push_dense(&mut out, format!("layers.{i}.{n}"), m)?;
                }
            }
            if let Some((g, p, _)) = &l.ple {
                push_dense(&mut out, format!("layers.{i}.ple_gate"), g)?;
                push_dense(&mut out, format!("layers.{i}.ple_projection"), p)?;
            }
        }
        if let Some(p) = &t.ple {
            push_dense(&mut out, "ple.table".into(), &p.table)?;
            push_dense(&mut out, "ple.projection".into(), &p.projection)?;
        }
        for (i, l) in t.layers.iter().enumerate() {
            out.push((format!("layers.{i}.input_norm"), &l.input_norm));
            out.push((format!("layers.{i}.pre_mlp_norm"), &l.pre_mlp_norm));
            if let Some(n) = &l.post_attn_norm {
                out.push((format!("layers.{i}.post_attn_norm"), n));
            }
            if let Some(n) = &l.post_mlp_norm {
                out.push((format!("layers.{i}.post_mlp_norm"), n));
            }
        }
        out.push(("final_norm".into(), &t.final_norm));
        Ok(out)
    }

    /// A 64-bit digest (FNV-1a over the f32 bits as read back) of every dense tensor, by
    /// name: equal digests mean bit-identical weights.
    pub fn weight_digests(&self) -> Result<Vec<(String, u64)>> {
        self.dense()?
            .into_iter()
            .map(|(name, buf)| {
                let values = self.backend.download(buf)?;
                let mut h: u64 = 0xcbf2_9ce4_8422_2325;
                for v in values {
                    for byte in v.to_bits().to_le_bytes() {
                        h ^= u64::from(byte);
                        h = h.wrapping_mul(0x0100_0000_01b3);
                    }
                }
                Ok((name, h))
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
