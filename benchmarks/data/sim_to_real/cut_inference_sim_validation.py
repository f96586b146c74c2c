"""Cut ``inference_sim_validation.json`` from its public sources (how the file was made).

    .venv/bin/python benchmarks/data/sim_to_real/cut_inference_sim_validation.py \
        --validation REPO_GIT_DIR --inference-sim REPO_GIT_DIR [--out FILE]

``--validation``: a clone of https://github.com/inference-sim/sim-to-real-accuracy-validation
(its ``error_records.csv`` files hold the real servers' stage figures in column ``actual``);
``--inference-sim``: a clone of https://github.com/inference-sim/inference-sim (the runs'
published workload profiles in ``testdata/trained_physics_iter29.json``). Both are read at the
commits below with ``git show``, so the output is the same file byte for byte.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import subprocess
from pathlib import Path

SRC24 = "09b9a8b402564bc78d96227ce3421a57a3dc7c1f"
SRCTV = "dcec3fd4711c761ac16557db720d1856b604579c"
GOLD = "f90a1e3a6787da17c2cd463dab6fb2660b1b1760"
TRAIN = "ed5c1d26900e6909758d5e1641a18edaf56a1caf"
def sp(users, sys_, q, out, groups):
    return {"enable_multi_turn_chat": True, "num_unique_system_prompts": groups,
            "num_users_per_system_prompt": users, "output_len": out, "question_len": q,
            "system_prompt_len": sys_}
WL = {
 "general": ([(8, 600), (20, 600)], sp(5, 100, 447, 248, 9), f"inference-sim/training@{TRAIN[:7]} default_args/*-general/profile.yaml"),
 "general-lite": ([(2.5, 600), (6, 600)], sp(5, 100, 447, 248, 9), f"inference-sim/inference-sim@{GOLD[:7]} testdata/trained_physics_iter29.json (runs 17, 60, 62, 65)"),
 "codegen": ([(5, 600), (10, 600)], sp(4, 100, 466, 247, 11), f"inference-sim/training@{TRAIN[:7]} default_args/*-codegen/profile.yaml"),
 "roleplay": ([(6, 1200)], sp(5, 150, 600, 251, 10), f"inference-sim/training@{TRAIN[:7]} default_args/*-roleplay/profile.yaml"),
 "reasoning-lite": ([(1, 1200)], sp(1, 100, 934, 1448, 23), f"inference-sim/inference-sim@{GOLD[:7]} testdata/trained_physics_iter29.json (runs 48, 66, 67)"),
}
MODELS = {"meta-llama/Llama-3.1-8B-Instruct": "llama-3.1-8b", "Qwen/Qwen3-14B": "qwen3-14b",
          "codellama/CodeLlama-34b-Instruct-hf": "codellama-34b", "meta-llama/Llama-2-70b-hf": "llama-2-70b",
          "mistralai/Mixtral-8x7B-v0.1": "mixtral-8x7b", "mistralai/Mixtral-8x22B-Instruct-v0.1": "mixtral-8x22b",
          "mistralai/Mixtral-8x22B-v0.1": "mixtral-8x22b", "meta-llama/Llama-3.1-70B-Instruct": "llama-3.1-70b",
          "Qwen/Qwen2.5-7B-Instruct": "qwen2.5-7b", "meta-llama/Llama-2-7b-hf": "llama-2-7b"}
HW = {"H100": "H100 SXM 80GB", "A100-80GB": "A100 SXM 80GB", "L40S": "L40S 48GB"}
KEEP24 = {13,14,15,16,18,19,22,23,24,25,26,27,28,29,30,31,36,38,40,41,49,50,51,53,54,55,56,57,58,59}
KEEPTV = {60, 61, 64, 66, 67}

def load(text: str, keep: set[int], commit: str, fname: str) -> dict:
    """The stage figures of the kept runs of one error_records.csv, by run folder."""
    out: dict = {}
    for r in csv.DictReader(io.StringIO(text)):
        folder = r["experiment_folder"].split("/")[-1]
        head = folder.split("-")[0]
        eid = int(head) if head.isdigit() and len(head) < 4 else None
        if eid not in keep:
            continue
        e = out.setdefault(folder, {"eid": eid, "meta": r, "stages": {}, "commit": commit,
                                    "file": fname})
        e["stages"].setdefault(int(r["stage_index"]), {})[r["metric_name"]] = float(r["actual"])
    return out


def show(git_dir: str, commit: str, path: str) -> str:
    return subprocess.run(["git", "--git-dir", git_dir, "show", f"{commit}:{path}"],
                          check=True, capture_output=True, text=True).stdout


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--validation", required=True)
    ap.add_argument("--inference-sim", required=True)
    ap.add_argument("--out", default=str(Path(__file__).with_name("inference_sim_validation.json")))
    args = ap.parse_args(argv)
    out = Path(args.out)
    gold = {e["id"]: e for e in json.loads(show(
        args.inference_sim, GOLD, "testdata/trained_physics_iter29.json"))["experiments"]}
    runs = {**load(show(args.validation, SRC24, "results_iter24/error_records.csv"),
                   KEEP24, SRC24, "results_iter24/error_records.csv"),
            **load(show(args.validation, SRCTV, "results_trainval/error_records.csv"),
                   KEEPTV, SRCTV, "results_trainval/error_records.csv")}
    res = []
    for folder, e in sorted(runs.items(), key=lambda kv: kv[1]["eid"]):
        m, eid = e["meta"], e["eid"]
        wl = next(w for w in sorted(WL, key=len, reverse=True) if f"-{w}-" in folder + "-")
        stages_cfg, shp, wl_src = WL[wl]
        if str(eid) in gold:
            g = gold[str(eid)]["workload"]["inference_perf"]
            stages_cfg = [(s["rate"], s["duration"]) for s in g["stages"]]
            shp = g["shared_prefix"]
            wl_src = (f"inference-sim/inference-sim@{GOLD[:7]} "
                      f"testdata/trained_physics_iter29.json (run {eid})")
        idx = sorted(k for k in e["stages"] if k >= 0)
        assert len(idx) == len(stages_cfg), (folder, idx, stages_cfg)
        stages = []
        for k, (rate, dur) in zip(idx, stages_cfg, strict=True):
            s = e["stages"][k]
            ms = {x: round(v / 1e3, 6) for x, v in s.items()}  # the source's ms, in s
            client_out = (s["e2e_mean"] - s["ttft_mean"]) / s["itl_mean"] + 1
            stages.append({"rate": rate, "duration_s": dur,
                           "ttft_s": {"mean": ms["ttft_mean"], "p90": ms["ttft_p90"],
                                      "p99": ms["ttft_p99"]},
                           "e2e_s": {"mean": ms["e2e_mean"], "p90": ms["e2e_p90"],
                                     "p99": ms["e2e_p99"]},
                           "itl_s_client": round(s["itl_mean"] / 1e3, 7),
                           "output_len_mean": round(client_out, 2),
                           "prompt_len_mean": shp["system_prompt_len"] + shp["question_len"] + 1,
                           "failures": 0, "successes": None, "requests_per_s": None,
                           "output_tokens_per_s": None})
        eng = {"max_model_len": 4096,
               "max_num_batched_tokens": int(float(m["max_num_batched_tokens"])),
               "max_num_seqs": 128}
        if m.get("gpu_mem_util"):
            eng["gpu_memory_utilization"] = float(m["gpu_mem_util"])
        gk = gold.get(str(eid))
        run = {"id": folder, "hf_model": m["model"], "model": MODELS[m["model"]],
               "hardware": HW[m["hardware"]], "tensor_parallel_size": int(float(m["tp"])),
               "engine": eng, "cpu_kv_offload": m.get("cpu_offload") == "True" or bool(gk and gk.get("cpu_kv_blocks")),
               "stages": stages,
               "workload": {"api": "completion", "arrivals": "constant", "ignore_eos": True, "streaming": True,
                            "name": wl,
                            "prompt_pool": {"num_groups": 10, "num_prompts_per_group": 10,
                                            "question_len": shp["question_len"], "system_prompt_len": shp["system_prompt_len"]},
                            "shared_prefix": shp},
               "source": {"measurements": f"inference-sim/sim-to-real-accuracy-validation@{e['commit'][:7]} {e['file']} (column actual, stage_index {idx})",
                          "workload": wl_src}}
        res.append(run)
    doc = {"source": {
      "what": "real vLLM v0.15.1 servers on H100 SXM, A100 SXM 80GB and L40S measured with inference-perf (streamed completions, ignore_eos, constant-interval sends), per-stage TTFT and E2E mean/p90/p99; the workloads' profiles (stages, lengths, prompt pool) joined from the collection's published profiles",
      "repository": "https://github.com/inference-sim/sim-to-real-accuracy-validation",
      "commits": {"results_iter24": SRC24, "results_trainval": SRCTV,
                  "profiles (inference-sim/inference-sim testdata)": GOLD,
                  "profiles (inference-sim/training default_args)": TRAIN},
      "vllm_version": "v0.15.1 (results/figure_captions.md of the measurements' repository)",
      "hardware": "per run",
      "itl_convention": "itl_s_client is the source's (E2E mean - TTFT mean) / (client-counted output_len mean - 1); output_len_mean is solved back from it (the client's count after re-tokenising the streamed text)",
      "assumed": "prompt_pool 10 x 10 and max_model_len 4096 as in the same collection's expanded configurations (inference-sim/training results/config.yaml, exp-config.yaml); max_num_seqs 128 as in testdata/trained_physics_iter29.json; prompt_len_mean = system_prompt_len + question_len + 1 (the configured tokens; the client's count after re-tokenising differs by a few percent); failures 0 (the source scores only runs its collection marks safe)"},
      "runs": res}
    out.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
