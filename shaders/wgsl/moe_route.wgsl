// Mixture-of-experts router: each token's top-k experts (ties to the lower expert) and their
// weights, one invocation per token. Selecting on logits equals selecting on softmax
// probabilities; a weight is exp(l - max) over the sum of all experts' (softmax, then top-k)
// or of the chosen k (renormalised, or top-k then softmax: the same numbers).
struct Params { tokens: u32, experts: u32, top_k: u32, renormalize: u32 }

@group(0) @binding(0) var<storage, read> logits: array<f32>;
@group(0) @binding(1) var<storage, read_write> ids: array<u32>;
@group(0) @binding(2) var<storage, read_write> weights: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

const NONE: u32 = 0xffffffffu;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let t = gid.x + gid.y * 65535u * 64u;
    if (t >= p.tokens) {
        return;
    }
    let row = t * p.experts;
    let slots = t * p.top_k;
    var mx = logits[row];
    for (var e = 1u; e < p.experts; e++) {
        mx = max(mx, logits[row + e]);
    }
    var total = 0.0;
    for (var e = 0u; e < p.experts; e++) {
        total += exp(logits[row + e] - mx);
    }
    var picked = 0.0;
    for (var s = 0u; s < p.top_k; s++) {
        var best = NONE;
        var best_v = 0.0;
        for (var e = 0u; e < p.experts; e++) {
            var taken = false;
            for (var j = 0u; j < s; j++) {
                taken = taken || ids[slots + j] == e;
            }
            let v = logits[row + e];
            if (!taken && (best == NONE || v > best_v)) {
                best = e;
                best_v = v;
            }
        }
        ids[slots + s] = best;
        let w = exp(best_v - mx);
        weights[slots + s] = w;
        picked += w;
    }
    let denom = select(total, picked, p.renormalize != 0u);
    for (var s = 0u; s < p.top_k; s++) {
        weights[slots + s] /= denom;
    }
}
