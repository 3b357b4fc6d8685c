"""A fake kiln_gpu.train for stages/train's unit tests only: it reads
plan.json, checks every micro-batch file's safetensors header against the
plan (plain Python, no torch), prints the event stream of
docs/train-stage.md §9 and saves a checkpoint directory of the right
shape (§6). KILN_FAKE_CRASH_AT=i exits 3 during step i;
KILN_FAKE_KILL_AT=i kills itself (SIGKILL) there; KILN_FAKE_HANG_AT=i
starts a child (its pid in $KILN_FAKE_PIDFILE) and hangs; KILN_FAKE_NO_OPTIMIZER=1
saves without optimizer.pt; KILN_FAKE_RANKS=FILE appends a line of each
process's RANK WORLD_SIZE LOCAL_RANK SLURM_JOB_ID SLURM_STEP_ID
SLURM_PROCID MASTER_ADDR MASTER_PORT ("-" for unset) to FILE. As
kiln_gpu.train, only rank 0 prints events and saves."""

import argparse
import json
import os
import shutil
import struct
import sys

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".msgpack", ".index.json", ".h5")
TRAINER_FILES = ("metrics.jsonl", "optimizer.pt", "trainer_state.json")


def header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
        body = len(f.read())
    end = max((v["data_offsets"][1] for k, v in h.items() if k != "__metadata__"), default=0)
    assert end == body, f"{path}: data ends at {end}, body has {body} bytes"
    return h


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--plan", required=True)
    a = p.parse_args()
    plan = json.load(open(a.plan))
    assert plan["format"] == "kiln-train-plan/1", plan["format"]
    ranks = os.environ.get("KILN_FAKE_RANKS")
    if ranks:
        names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_PROCID", "MASTER_ADDR", "MASTER_PORT")
        with open(ranks, "a") as f:
            f.write(" ".join(os.environ.get(n) or "-" for n in names) + "\n")
    if os.environ.get("RANK", "0") != "0":
        return
    root = os.path.dirname(a.plan)
    crash = os.environ.get("KILN_FAKE_CRASH_AT")
    print(json.dumps({"event": "start", "steps": len(plan["steps"]), "model": plan["model"]}), flush=True)
    print("fake trainer: loading", plan["model"], file=sys.stderr, flush=True)
    out = plan["out"]
    os.makedirs(out, exist_ok=True)
    metrics = []
    for s in plan["steps"]:
        if os.environ.get("KILN_FAKE_HANG_AT") == str(s["index"]):
            import subprocess, time
            child = subprocess.Popen(["sleep", "300"])
            open(os.environ["KILN_FAKE_PIDFILE"], "w").write(str(child.pid))
            time.sleep(300)
        if os.environ.get("KILN_FAKE_KILL_AT") == str(s["index"]):
            os.kill(os.getpid(), 9)
        if crash is not None and int(crash) == s["index"]:
            print(f"fake trainer: crashing in step {s['index']}", file=sys.stderr, flush=True)
            sys.exit(3)
        segs = tokens = 0
        for mb in s["micro_batches"]:
            h = header(os.path.join(root, mb))
            segs += h["response_lengths"]["shape"][0]
            tokens += h["tokens"]["shape"][0]
        assert segs == s["segments"] and tokens == s["tokens"], (segs, tokens, s)
        m = {"event": "step", "step": s["index"], "steps": len(plan["steps"]), "loss": 0.1 * s["index"],
             "pg_clipfrac": 0.0, "ppo_kl": 0.0, "train_rollout_logprob_abs_diff": 0.0, "grad_norm": 1.0,
             "tokens": tokens, "tokens_per_s": 1000.0, "time_s": 0.01}
        metrics.append(m)
        print(json.dumps(m), flush=True)
    model = plan["model"]
    for f in os.listdir(model):
        src = os.path.join(model, f)
        if os.path.isfile(src) and not f.endswith(WEIGHT_SUFFIXES) and f not in TRAINER_FILES:
            shutil.copyfile(src, os.path.join(out, f))
    shard = "model-00001-of-00001.safetensors"
    hdr = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    with open(os.path.join(out, shard), "wb") as f:
        f.write(struct.pack("<Q", len(hdr)) + hdr + struct.pack("<f", 1.0))
    json.dump({"metadata": {"total_size": 4}, "weight_map": {"w": shard}}, open(os.path.join(out, "model.safetensors.index.json"), "w"))
    with open(os.path.join(out, "metrics.jsonl"), "w") as f:
        for m in metrics:
            f.write(json.dumps(m) + "\n")
    if not os.environ.get("KILN_FAKE_NO_OPTIMIZER"):
        open(os.path.join(out, "optimizer.pt"), "wb").write(b"fake optimizer state")
    state = {"steps": len(plan["steps"]), "resume_from": plan["resume_from"], "seed": plan["seed"]}
    if plan["resume_from"]:
        state["resumed_optimizer"] = open(os.path.join(plan["resume_from"], "optimizer.pt"), "rb").read().decode()
    json.dump(state, open(os.path.join(out, "trainer_state.json"), "w"))
    print(json.dumps({"event": "saved", "dir": out}), flush=True)


if __name__ == "__main__":
    main()
