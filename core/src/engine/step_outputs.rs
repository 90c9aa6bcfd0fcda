//! What one step gives back: one output per request, a speculating request's later
//! verification rounds merged into it.

use std::collections::HashMap;

use super::RequestOutput;

/// A step's outputs, one per request: a speculating request's later rounds merge into it.
#[derive(Default)]
pub(super) struct StepOutputs {
    outputs: Vec<RequestOutput>,
    /// Built at the second round (steps without speculation never pay for it).
    index: Option<HashMap<String, usize>>,
}

impl StepOutputs {
    /// Outputs from now on may belong to requests that already have one.
    pub fn start_merging(&mut self) {
        if self.index.is_none() {
            let index = self.outputs.iter().enumerate();
            self.index = Some(index.map(|(i, o)| (o.request_id.clone(), i)).collect());
        }
    }

    pub fn push(&mut self, out: RequestOutput) {
        let Some(index) = self.index.as_mut() else {
            self.outputs.push(out);
            return;
        };
        let Some(&i) = index.get(&out.request_id) else {
            index.insert(out.request_id.clone(), self.outputs.len());
            self.outputs.push(out);
            return;
        };
        let prev = &mut self.outputs[i];
        for d in out.deltas {
            match prev.deltas.iter_mut().find(|p| p.index == d.index) {
                Some(p) => {
                    p.new_token_ids.extend(d.new_token_ids);
                    p.text_delta.push_str(&d.text_delta);
                    p.logprobs.extend(d.logprobs);
                    p.finish_reason = d.finish_reason;
                    p.stop_reason = d.stop_reason;
                }
                None => prev.deltas.push(d),
            }
        }
        prev.outputs = out.outputs;
        prev.prompt_logprobs = out.prompt_logprobs.or(prev.prompt_logprobs.take());
        prev.metrics = out.metrics;
    }

    pub fn into_vec(self) -> Vec<RequestOutput> {
        self.outputs
    }
}
