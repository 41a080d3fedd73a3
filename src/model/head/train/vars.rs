//! A head's weights as trainable variables, and back to tensors.
//!
//! Why it exists: the optimizer steps variables while a checkpoint or a drafter reads plain
//! tensors; both directions, and the list the optimizer and the gradient clip walk, are here.

use candle_core::{Tensor, Var};

use crate::model::head::{Eagle3Parts, HeadTensors};
use crate::model::Result;

/// A head's weights as trainable variables, in the order [`HeadTensors`] lists them.
pub(super) struct HeadVars {
    pub(super) fc: Var,
    pub(super) fc_bias: Option<Var>,
    pub(super) q: Var,
    pub(super) k: Var,
    pub(super) v: Var,
    pub(super) o: Var,
    pub(super) ffn_norm: Var,
    pub(super) gate: Var,
    pub(super) up: Var,
    pub(super) down: Var,
    pub(super) eagle3: Option<Eagle3Vars>,
}

/// An EAGLE-3 head's own trainable parts.
pub(super) struct Eagle3Vars {
    pub(super) input_norm: Var,
    pub(super) hidden_norm: Var,
    pub(super) final_norm: Var,
    pub(super) lm_head: Var,
}

impl HeadVars {
    /// Variables holding copies of `init`'s trained weights.
    pub(super) fn new(init: &HeadTensors) -> Result<HeadVars> {
        let var = |t: &Tensor| Var::from_tensor(t);
        Ok(HeadVars {
            fc: var(&init.fc)?,
            fc_bias: init.fc_bias.as_ref().map(var).transpose()?,
            q: var(&init.q)?,
            k: var(&init.k)?,
            v: var(&init.v)?,
            o: var(&init.o)?,
            ffn_norm: var(&init.ffn_norm)?,
            gate: var(&init.gate)?,
            up: var(&init.up)?,
            down: var(&init.down)?,
            eagle3: match &init.eagle3 {
                Some(p) => Some(Eagle3Vars {
                    input_norm: var(&p.input_norm)?,
                    hidden_norm: var(&p.hidden_norm)?,
                    final_norm: var(&p.final_norm)?,
                    lm_head: var(&p.lm_head)?,
                }),
                None => None,
            },
        })
    }

    /// The weights as they stand, detached, with the head's parts that are not trained: its
    /// token ranking and an EAGLE-3 head's vocabulary, taps and RoPE.
    pub(super) fn tensors(&self, token_rank: Vec<u32>, parts: Option<&Eagle3Parts>) -> HeadTensors {
        let t = |x: &Var| x.as_tensor().detach();
        HeadTensors {
            fc: t(&self.fc),
            fc_bias: self.fc_bias.as_ref().map(t),
            q: t(&self.q),
            k: t(&self.k),
            v: t(&self.v),
            o: t(&self.o),
            ffn_norm: t(&self.ffn_norm),
            gate: t(&self.gate),
            up: t(&self.up),
            down: t(&self.down),
            token_rank,
            eagle3: parts.zip(self.eagle3.as_ref()).map(|(p, e)| Eagle3Parts {
                input_norm: t(&e.input_norm),
                hidden_norm: t(&e.hidden_norm),
                final_norm: t(&e.final_norm),
                lm_head: t(&e.lm_head),
                ..p.clone()
            }),
        }
    }

    /// Every variable, in the order the optimizer was given them.
    pub(super) fn all(&self) -> Vec<Var> {
        let mut v = vec![
            self.fc.clone(),
            self.q.clone(),
            self.k.clone(),
            self.v.clone(),
            self.o.clone(),
            self.ffn_norm.clone(),
            self.gate.clone(),
            self.up.clone(),
            self.down.clone(),
        ];
        v.extend(self.fc_bias.clone());
        if let Some(e) = &self.eagle3 {
            v.extend([
                e.input_norm.clone(),
                e.hidden_norm.clone(),
                e.final_norm.clone(),
                e.lm_head.clone(),
            ]);
        }
        v
    }
}
