"""Run every benchmark in turn (each in its own process and bench_* database).

    python bench/run_all.py            full run (< 15 min on 2 cores), bench/results/
    python bench/run_all.py --quick    smoke run (< 2 min), bench/results/quick/
    python bench/run_all.py --only drain_throughput scheduler

Prints each benchmark's table as it goes, then a summary of the targets, and writes
bench/results[/quick]/summary.json. Exits non-zero only if a benchmark crashed (a missed target is
a result, not a crash).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import _harness as h

BENCHMARKS = (
    "ti_lock_success",
    "ti_run_consumed",
    "drain_throughput",
    "as_shipped",
    "burst",
    "scheduler",
    "drain_scaling",
    "time_schedules",
    "watcher",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", nargs="*", choices=BENCHMARKS, default=None)
    args = parser.parse_args()
    started = time.monotonic()
    summary = {}
    crashed = []
    for name in args.only or BENCHMARKS:
        print(f"=== {name} ===", flush=True)
        t0 = time.monotonic()
        argv = [h.PYTHON, str(h.ROOT / "bench" / f"{name}.py")] + (
            ["--quick"] if args.quick else []
        )
        code = subprocess.run(argv, cwd=h.ROOT).returncode
        seconds = time.monotonic() - t0
        result_file = h.results_dir(args) / f"{name}.json"
        target = None
        if code == 0 and result_file.exists():
            target = json.loads(result_file.read_text()).get("target")
        else:
            crashed.append(name)
        summary[name] = {"exit_code": code, "seconds": round(seconds, 1), "target": target}
        print(f"=== {name}: exit {code}, {seconds:.0f} s ===\n", flush=True)
    total = time.monotonic() - started
    h.print_table(
        f"run_all{' --quick' if args.quick else ''}: {total:.0f} s",
        ["benchmark", "seconds", "targets"],
        [
            [name, row["seconds"], _verdict(row["target"]) if row["exit_code"] == 0 else "CRASHED"]
            for name, row in summary.items()
        ],
    )
    path = h.results_dir(args) / "summary.json"
    path.write_text(json.dumps({"seconds": round(total, 1), "benchmarks": summary}, indent=2))
    print(f"wrote {path.relative_to(h.ROOT)}")
    sys.exit(1 if crashed else 0)


def _verdict(target: dict | None) -> str:
    if not target:
        return "?"
    met = target.get("met")
    if isinstance(met, dict):
        missed = [key for key, ok in met.items() if not ok]
        return "all met" if not missed else "missed: " + ", ".join(missed)
    flags = {k: v for k, v in target.items() if k.endswith("_met")}
    if flags:
        missed = [k.removesuffix("_met") for k, ok in flags.items() if not ok]
        return "all met" if not missed else "missed: " + ", ".join(missed)
    return "met" if met else "MISSED"


if __name__ == "__main__":
    main()
