//! A block's feed-forward layer, written once against `Backend`: a gated MLP, or routed
//! experts (the router picks each token's top-k experts, the step's tokens are grouped by
//! expert once, each expert runs its gate/up/down over its group, and each token's expert
//! outputs are summed with its routing weights).

use crate::backend::Backend;
use crate::config::{Activation, ModelConfig};
use crate::error::{BackendError, InferError, Result};
use crate::moe::MoeRouting;
use crate::weights::LayerWeight;

pub(super) enum Mlp<T> {
    Dense {
        gate: T,
        up: T,
        down: T,
    },
    /// Routed experts: `router [experts, hidden]`, and every expert's gate/up/down stacked.
    Routed {
        router: T,
        gate: T,
        up: T,
        down: T,
        /// gpt-oss: the router's bias, and the experts' (gate, up, down) biases.
        router_bias: Option<T>,
        biases: Option<(T, T, T)>,
        routing: MoeRouting,
    },
}

impl<T> Mlp<T> {
    /// The weights layer `layer`'s MLP takes, in load order.
    pub(super) fn weights(c: &ModelConfig, layer: usize) -> Vec<LayerWeight> {
        use LayerWeight::*;
        let Some(moe) = c.layer_moe(layer) else {
            return vec![Gate, Up, Down];
        };
        let mut w = vec![Router];
        if moe.biases {
            w.push(RouterBias);
        }
        w.extend([ExpGate, ExpUp, ExpDown]);
        if moe.biases {
            w.extend([ExpGateBias, ExpUpBias, ExpDownBias]);
        }
        w
    }

    /// Takes layer `layer`'s MLP weights from `weight` (`None` for those the layer lacks), in
    /// the order of `weights`.
    pub(super) fn load(
        c: &ModelConfig,
        layer: usize,
        weight: &mut impl FnMut(LayerWeight) -> Result<Option<T>>,
    ) -> Result<Self> {
        use LayerWeight::*;
        // A weight `weights` listed for this layer.
        let need = |weight: &mut dyn FnMut(LayerWeight) -> Result<Option<T>>, w| {
            weight(w)?
                .ok_or_else(|| InferError::Config(format!("layer {layer}: {w:?} is not planned")))
        };
        let Some(moe) = c.layer_moe(layer) else {
            return Ok(Mlp::Dense {
                gate: need(weight, Gate)?,
                up: need(weight, Up)?,
                down: need(weight, Down)?,
            });
        };
        let router = need(weight, Router)?;
        let router_bias = weight(RouterBias)?;
        let gate = need(weight, ExpGate)?;
        let up = need(weight, ExpUp)?;
        let down = need(weight, ExpDown)?;
        let biases = match (
            weight(ExpGateBias)?,
            weight(ExpUpBias)?,
            weight(ExpDownBias)?,
        ) {
            (Some(g), Some(u), Some(d)) => Some((g, u, d)),
            _ => None,
        };
        Ok(Mlp::Routed {
            router,
            gate,
            up,
            down,
            router_bias,
            biases,
            routing: moe.routing,
        })
    }

    /// The MLP of `h [tokens, hidden]`. `first_rank`: this rank adds the biases that follow
    /// a row-parallel matmul (the ranks' partial outputs are summed afterwards).
    pub(super) fn forward<B: Backend<Tensor = T>>(
        &self,
        backend: &B,
        h: &T,
        activation: Activation,
        first_rank: bool,
    ) -> Result<T> {
        let act = |gate: &T, up: &T| match activation {
            Activation::Silu => backend.silu_mul(gate, up),
            Activation::GeluTanh => backend.gelu_tanh_mul(gate, up),
            Activation::SwigluClamped { alpha, limit } => {
                backend.swiglu_clamped(gate, up, alpha, limit)
            }
        };
        match self {
            Mlp::Dense { gate, up, down } => {
                let [g, u] = outputs(backend, backend.matmul_many(h, &[gate, up])?)?;
                backend.matmul(&act(&g, &u)?, down)
            }
            Mlp::Routed {
                router,
                gate,
                up,
                down,
                router_bias,
                biases,
                routing,
            } => {
                let mut logits = backend.matmul_logits(h, router)?;
                if let Some(b) = router_bias {
                    backend.add_bias(&mut logits, b)?;
                }
                let route = backend.moe_route(&logits, routing)?;
                let mut g = backend.moe_matmul(h, gate, &route)?;
                let mut u = backend.moe_matmul(h, up, &route)?;
                if let Some((gb, ub, _)) = biases {
                    backend.moe_add_bias(&mut g, gb, &route)?;
                    backend.moe_add_bias(&mut u, ub, &route)?;
                }
                let mut y = backend.moe_matmul(&act(&g, &u)?, down, &route)?;
                if let Some((_, _, db)) = biases.as_ref().filter(|_| first_rank) {
                    backend.moe_add_bias(&mut y, db, &route)?;
                }
                backend.moe_combine(&y, &route)
            }
        }
    }
}

/// `matmul_many`'s outputs as an array of the count asked for.
pub(super) fn outputs<B: Backend, const N: usize>(
    backend: &B,
    outs: Vec<B::Tensor>,
) -> Result<[B::Tensor; N]> {
    let got = outs.len();
    outs.try_into()
        .map_err(|_| BackendError::count("matmul_many", "outputs", got, N).on(backend.name()))
}
