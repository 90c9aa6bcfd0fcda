"""The example Kubernetes files next to the README's "Scaling out" section: they parse, each
object is well formed, and the infer and router command lines in them are ones the programs
accept (`--help`-checked flags, the probed paths served)."""

import pathlib
import re
import subprocess
import sys

import yaml

from conftest import ROOT, binary

DEPLOY = ROOT / "web" / "deploy" / "kubernetes"


def documents():
    files = sorted(DEPLOY.glob("*.yaml"))
    assert {f.name for f in files} >= {"replicas.yaml", "tensor-parallel-lws.yaml"}
    for f in files:
        for doc in yaml.safe_load_all(f.read_text()):
            yield f.name, doc


def containers(doc):
    spec = doc.get("spec", {})
    templates = []
    if doc["kind"] == "Deployment":
        templates.append(spec["template"])
    if doc["kind"] == "LeaderWorkerSet":
        lwt = spec["leaderWorkerTemplate"]
        templates += [lwt["leaderTemplate"], lwt["workerTemplate"]]
    return [c for t in templates for c in t["spec"]["containers"]]


def infer_flags(text: str):
    """`--flag` names of every `infer ...` command line in a container's command and args."""
    return re.findall(r"(--[a-z-]+)", text.split("infer serve", 1)[1]) if "infer serve" in text else []


def test_every_object_is_well_formed_and_probes_what_infer_serves():
    kinds = []
    for name, doc in documents():
        assert doc["apiVersion"] and doc["kind"] and doc["metadata"]["name"], name
        kinds.append(doc["kind"])
        for c in containers(doc):
            for probe in ("readinessProbe", "livenessProbe"):
                if probe in c:
                    assert c[probe]["httpGet"]["path"] == "/health"
    assert {"Deployment", "LeaderWorkerSet", "Service"} <= set(kinds)


def test_command_lines_use_flags_the_programs_accept():
    help_text = subprocess.run([binary(), "serve", "--help"], capture_output=True, text=True).stdout
    router_help = subprocess.run(
        [sys.executable, "-m", "sglang_router.launch_router", "--help"],
        capture_output=True, text=True).stdout
    checked = 0
    for name, doc in documents():
        for c in containers(doc):
            line = " ".join(c.get("command", []) + c.get("args", []))
            if c["command"][0] == "infer":
                line = "infer " + " ".join(c["args"])
            for flag in infer_flags(line):
                assert flag in help_text, f"{name}: infer serve has no {flag}"
                checked += 1
            if "sglang_router" in line:
                for flag in re.findall(r"(--[a-z-]+)", " ".join(c["args"])):
                    assert flag in router_help, f"{name}: sglang-router has no {flag}"
                    checked += 1
    assert checked > 10


def test_tensor_parallel_group_size_matches_its_ranks():
    for name, doc in documents():
        if doc["kind"] != "LeaderWorkerSet":
            continue
        size = doc["spec"]["leaderWorkerTemplate"]["size"]
        leader = doc["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]
        env = {e["name"]: e["value"] for e in leader["env"]}
        assert int(env["TP"]) == size
        assert '-np "$TP"' in leader["args"][0] and '--tensor-parallel-size "$TP"' in leader["args"][0]
