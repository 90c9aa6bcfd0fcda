#!/usr/bin/env python3
"""Float64 beam search over the numpy reference model (scripts/reference.py), for the engine's
beam search test. Same rules as the engine (and Hugging Face's BeamSearchScorer):

- each live beam proposes its 2*W most likely next tokens (log-softmax of the raw logits);
  all proposals are ranked by cumulative logprob (ties: lower beam, then lower token id);
- walking them best first, an EOS proposal ranked within the first W finishes a hypothesis,
  other proposals become the next beams until W are found;
- a beam reaching max_tokens finishes with reason "length";
- score = cumulative_logprob / generated_len ** length_penalty (EOS counted);
- with early_stopping False the search ends when W hypotheses exist and the best live beam,
  scored at its current length, cannot beat the W-th best; results sorted by score.

Writes fixtures/beam.json.  Run:  python3 scripts/beam_reference.py models/SmolLM2-135M-Instruct.Q4_1.gguf
"""
import argparse
import hashlib
import json
import pathlib
import sys

import jinja2
import numpy as np
from gguf import GGUFReader

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from reference import Model, field, hf_tokenizer  # noqa: E402

CASES = [
    # name, chat, text, beam width, max_tokens, length_penalty
    ("raw", False, "The capital of France is", 4, 8, 1.0),
    ("chat", True, "Name a primary color.", 4, 16, 1.0),
    ("short", True, "What is 2+2? Answer with just the number.", 4, 8, 1.0),
]


def log_softmax(x):
    m = x.max()
    return x - (m + np.log(np.exp(x - m).sum()))


def score(cum, n, lp):
    return cum / max(n, 1) ** lp


def beam_search(model, ids, width, max_tokens, lp, eos):
    cache = [None] * model.n_layer
    live = [dict(out=[], cum=0.0, cache=cache, logits=model.forward(np.array(ids), cache))]
    done = []
    gaps = []
    while live:
        cands = []
        for i, b in enumerate(live):
            l = log_softmax(b["logits"])
            top = sorted(range(len(l)), key=lambda t: (-l[t], t))[: 2 * width]
            cands += [(b["cum"] + l[t], i, t) for t in top]
        cands.sort(key=lambda c: (-c[0], c[1], c[2]))
        gaps.append(min(cands[k][0] - cands[k + 1][0] for k in range(min(len(cands) - 1, 2 * width))))
        nxt = []
        for rank, (cum, i, t) in enumerate(cands):
            if len(nxt) == width:
                break
            if t in eos:
                if rank < width:
                    done.append(dict(out=live[i]["out"] + [t], cum=cum, finish="stop"))
            else:
                nxt.append((i, t, cum))
        new_live = []
        for i, t, cum in nxt:
            out = live[i]["out"] + [t]
            if len(out) >= max_tokens:
                done.append(dict(out=out, cum=cum, finish="length"))
                continue
            c = list(live[i]["cache"])
            new_live.append(dict(out=out, cum=cum, cache=c, logits=model.forward(np.array([t]), c)))
        live = new_live
        scores = sorted((score(d["cum"], len(d["out"]), lp) for d in done), reverse=True)
        if live and len(scores) >= width:
            best = max(live, key=lambda b: b["cum"])
            if scores[width - 1] >= score(best["cum"], len(best["out"]), lp):
                break
    done.sort(key=lambda d: -score(d["cum"], len(d["out"]), lp))
    return done[:width], min(gaps)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--out", default="fixtures")
    args = ap.parse_args()
    reader = GGUFReader(args.model)
    tok = hf_tokenizer(reader)
    template = jinja2.Environment().from_string(field(reader, "tokenizer.chat_template"))
    eos = {int(field(reader, "tokenizer.ggml.eos_token_id"))}
    model = Model(reader)
    cases = []
    for name, chat, text, width, max_tokens, lp in CASES:
        prompt = template.render(messages=[{"role": "user", "content": text}], add_generation_prompt=True) if chat else text
        ids = tok.encode(prompt, add_special_tokens=False).ids
        beams, gap = beam_search(model, ids, width, max_tokens, lp, eos)
        cases.append(dict(
            name=name, prompt_ids=ids, beam_width=width, max_tokens=max_tokens, length_penalty=lp,
            min_candidate_gap=gap,
            beams=[dict(token_ids=[int(t) for t in b["out"]], cumulative_logprob=float(b["cum"]),
                        finish_reason=b["finish"], text=tok.decode(b["out"])) for b in beams],
        ))
        print(f"{name}: min gap {gap:.2e}; " + " | ".join(f"{tok.decode(b['out'])!r} {b['cum']:.3f}" for b in beams))
    sha = hashlib.sha256(pathlib.Path(args.model).read_bytes()).hexdigest()
    doc = dict(generator="scripts/beam_reference.py", model_sha256=sha, cases=cases)
    (pathlib.Path(args.out) / "beam.json").write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
