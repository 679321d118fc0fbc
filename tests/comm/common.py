"""Helpers for the script tests that drive build/bin/trainer."""
import json
import os
import subprocess

TRAINER = os.environ["TRAINER"]
FASHION = os.environ["FASHION_H5"]


def trainer_cmd(np, args):
    base = [TRAINER] if np == 1 else ["mpirun", "-np", str(np), TRAINER]
    return base + [f"--data.path={FASHION}"] + list(args)


def run_trainer(np, args, timeout=600):
    p = subprocess.run(trainer_cmd(np, args), capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise AssertionError(f"trainer -np {np} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p


def metrics(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(l) for l in f]


def step_losses(run_dir):
    return [r["loss"] for r in metrics(run_dir) if r["type"] == "step"]
