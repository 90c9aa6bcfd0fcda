"""lm-evaluation-harness's `local-completions` model against `infer serve`, with its remote
tokenizer (`GET /tokenizer_info`, `/tokenize`, `/detokenize`): a task of our own (local data,
no network) scored end to end by log-likelihood and by generation."""

import json

from lm_eval import simple_evaluate
from lm_eval.tasks import TaskManager

from conftest import KEY, MODEL

# Plain completions (the base-model style lm-eval tasks use), which SmolLM2 gets right.
# (lm-eval joins context and continuation with its `target_delimiter`, a space.)
QUESTIONS = [
    ("The capital of France is", ["Paris", "Rome", "Berlin"], 0),
    ("Bees make", ["steel", "honey", "glass"], 1),
    ("The sun rises in the", ["west", "north", "east"], 2),
    ("One, two, three,", ["four", "ten", "seven"], 0),
]


def write_task(tmp_path):
    data = tmp_path / "data.jsonl"
    with data.open("w") as f:
        for q, choices, answer in QUESTIONS:
            f.write(json.dumps({"question": q, "choices": choices, "answer": answer,
                                "target": choices[answer]}) + "\n")
    common = f"""dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
doc_to_text: "{{{{question}}}}"
"""
    (tmp_path / "infer_smoke_mc.yaml").write_text(common + """task: infer_smoke_mc
output_type: multiple_choice
doc_to_choice: "{{choices}}"
doc_to_target: "{{answer}}"
metric_list:
  - metric: acc
""")
    (tmp_path / "infer_smoke_gen.yaml").write_text(common + """task: infer_smoke_gen
output_type: generate_until
doc_to_target: "{{target}}"
generation_kwargs:
  until: ["\\n", ".", ","]
  max_gen_toks: 8
  do_sample: false
metric_list:
  - metric: exact_match
    ignore_case: true
    ignore_punctuation: true
    regexes_to_ignore: ["\\\\s"]
""")


def test_local_completions_with_the_remote_tokenizer(server, tmp_path, monkeypatch):
    write_task(tmp_path)
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    args = (f"model={MODEL},base_url={server}/v1/completions,tokenizer_backend=remote,"
            f"auth_token={KEY},num_concurrent=2,max_retries=1,tokenized_requests=True")
    results = simple_evaluate(model="local-completions", model_args=args,
                              tasks=["infer_smoke_mc", "infer_smoke_gen"],
                              task_manager=TaskManager(include_path=str(tmp_path)),
                              log_samples=True)
    mc = results["results"]["infer_smoke_mc"]
    gen = results["results"]["infer_smoke_gen"]
    # SmolLM2 gets all four by log-likelihood (a misaligned logprob path scores ~1/3) and
    # generates "Paris" and "four" greedily.
    assert mc["acc,none"] == 1.0, results["results"]
    assert gen["exact_match,none"] >= 0.5, results["results"]
    # " Paris" is the greedy next token after the first context: lm-eval saw it as such.
    first = results["samples"]["infer_smoke_mc"][0]
    loglikelihood, is_greedy = first["filtered_resps"][0]
    assert is_greedy and -1.0 < loglikelihood < 0.0, first["filtered_resps"]
