"""Print the README's performance table (Markdown) from bench/results/*.json.

python bench/report.py            from the full run's results
python bench/report.py --quick    from bench/results/quick/
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import _harness as h


def load(directory: Path, name: str) -> dict[str, Any] | None:
    path = directory / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def ok(flag: bool) -> str:
    return "met" if flag else "**missed**"


def rows(directory: Path) -> list[tuple[str, str, str, str]]:
    out: list[tuple[str, str, str, str]] = []
    lock = load(directory, "ti_lock_success")
    if lock:
        q = {r["outlets"]: r for r in lock["results"] if r["mode"] == "queue"}
        i = {r["outlets"]: r for r in lock["results"] if r["mode"] == "inline"}
        t = lock["target"]
        holds = ", ".join(f"{n}: {r['hold_ms']['median']:.2f}" for n, r in q.items())
        out.append(
            (
                "TI lock hold on success, queue mode (median ms by outlets)",
                holds,
                "<= 2 ms at every N",
                ok(t["queue_max_median_hold_ms"] <= t["queue_median_hold_ms_max"]),
            )
        )
        out.append(
            (
                "same, flatness hold(1000)/hold(1)",
                f"{t['queue_flatness']:.2f}",
                "<= 1.5",
                ok(t["queue_flatness"] <= t["queue_flatness_max"]),
            )
        )
        out.append(
            (
                "statements under the TI lock / per request (queue)",
                f"{q[1000]['statements_under_lock']['median']:g} / "
                f"{q[1000]['statements_per_request']['median']:g} at every N",
                "flat (Airflow: 5 per outlet)",
                ok(len({r["statements_under_lock"]["median"] for r in q.values()}) == 1),
            )
        )
        out.append(
            (
                "success latency at 1,000 outlets (median ms), queue / inline",
                f"{q[1000]['latency_ms']['median']:.0f} / {i[1000]['latency_ms']['median']:.0f}",
                "(Airflow 3.3.2 holds the lock 5,000 ms)",
                "",
            )
        )
        out.append(
            (
                "TI lock hold, inline mode at 1 / 1,000 outlets (median ms)",
                f"{i[1]['hold_ms']['median']:.2f} / {i[1000]['hold_ms']['median']:.2f}",
                "(for comparison)",
                "",
            )
        )
    run = load(directory, "ti_run_consumed")
    if run:
        r = {x["consumed_events"]: x for x in run["results"]}
        t = run["target"]
        out.append(
            (
                "ti_run lock hold (median ms at 1 / 5,000 consumed events)",
                f"{r[1]['hold_ms']['median']:.2f} / {r[5000]['hold_ms']['median']:.2f}",
                "<= 2 ms, flat",
                ok(t["hold_met"] and t["flat_met"]),
            )
        )
        out.append(
            (
                "ti_run statements per request (1 .. 5,000 events)",
                ", ".join(f"{x['statements_per_request']['median']:g}" for x in r.values()),
                "constant (Airflow: 5,016)",
                ok(t["statements_constant_met"]),
            )
        )
        out.append(
            (
                "ti_run latency at 5,000 consumed events (median ms)",
                f"{r[5000]['latency_ms']['median']:.0f}",
                "< 200 ms (Airflow: 2,300)",
                ok(t["latency_met"]),
            )
        )
    drain = load(directory, "drain_throughput")
    if drain:
        d = {(x["batch"], x["fanout"]): x["events_per_s"]["median"] for x in drain["results"]}
        raw = {x["fanout"]: x["events_per_s"] for x in drain["raw_postgresql"]}
        out.append(
            (
                "drain events/s, batch 500, fan-out 1 / 4 / 8",
                f"{d[(500, 1)]:,.0f} / {d[(500, 4)]:,.0f} / {d[(500, 8)]:,.0f}",
                ">= 5,000 at fan-out 4",
                ok(drain["target"]["met"]),
            )
        )
        out.append(
            (
                "drain events/s, batch 1 / 50 / 500, fan-out 4",
                f"{d[(1, 4)]:,.0f} / {d[(50, 4)]:,.0f} / {d[(500, 4)]:,.0f}",
                "",
                "",
            )
        )
        out.append(
            (
                "raw PostgreSQL insert rate, same shape, fan-out 1 / 4 / 8",
                f"{raw[1]:,.0f} / {raw[4]:,.0f} / {raw[8]:,.0f}",
                "(ceiling)",
                "",
            )
        )
    shipped = load(directory, "as_shipped")
    if shipped:
        idle = shipped["idle"]
        t = shipped["target"]
        out.append(
            (
                "as shipped (bin/serve, every sweep and timer): idle transactions/s, CPU % of a "
                f"core ({idle['seconds']:.0f} s)",
                f"{idle['transactions_per_second']}, {idle['cpu_percent_of_one_core']} %",
                f"<= {t['idle_transactions_per_second']:g}, < {t['idle_cpu_percent']:g} %",
                ok(
                    idle["transactions_per_second"] <= t["idle_transactions_per_second"]
                    and idle["cpu_percent_of_one_core"] < t["idle_cpu_percent"]
                ),
            )
        )
        for phase in shipped["phases"]:
            s = phase["latency_ms"]
            what = "event (POST)" if phase["kind"] == "event" else "success"
            out.append(
                (
                    f"as shipped, busy ({shipped['policies']:,} freshness policies, a receiver "
                    f"answering 500): {what} -> run committed at {phase['rate_per_s']:g}/s "
                    f"({phase['achieved_rate_per_s']:g}/s achieved), p50 / p99 ms",
                    f"{s['median']:.0f} / {s['p99']:.0f}",
                    f"p99 < {t['p99_ms']:,.0f}",
                    ok(s["p99"] < t["p99_ms"] and not phase["never_consumed"]),
                )
            )
        ticks = shipped["ticks"]
        out.append(
            (
                f"as shipped, busy: tick -> run committed, {shipped['minute_dags']:,} minute Dags "
                f"x {ticks['ticks']} ticks, p50 / p99 s",
                f"{ticks['latency_s']['median']:.2f} / {ticks['latency_s']['p99']:.2f}",
                f"p99 < {t['tick_p99_s']:g}",
                ok(
                    ticks["latency_s"]["p99"] < t["tick_p99_s"]
                    and ticks["runs"] == ticks["expected_runs"]
                ),
            )
        )
    for name in ("burst", "burst_2000"):
        burst = load(directory, name)
        if not burst:
            continue
        m = burst["target"]["met"]
        n = burst["concurrency"]
        cpu = burst.get("cpu_seconds_until_last_response") or {}
        web = cpu.get("gunicorn (all workers)")
        out.append(
            (
                f"burst {n:,} x {burst['outlets']} outlets: errors, p99 ms",
                f"{burst['error_count']}, {burst['latency_ms']['p99']:,.0f}",
                f"0, <= {burst['target']['p99_ms']:,.0f}",
                ok(m["errors"] and m["p99"]),
            )
        )
        if web is not None:
            pg = cpu["postgres backends of this database"] / n * 1000
            drain = cpu["qcluster (drain)"] / n * 1000
            out.append(
                (
                    f"burst {n:,}: web CPU per success ms (PostgreSQL, drain)",
                    f"{web / n * 1000:.1f} ({pg:.1f}, {drain:.1f})",
                    "<= 5",
                    ok(m.get("web_cpu", False)),
                )
            )
        out.append(
            (
                f"burst {n:,}: peak RSS MB, web workers / cluster (PSS)",
                f"{burst['gunicorn_peak_rss_mb']:.0f} / {burst['qcluster_peak_rss_mb']:.0f}"
                + (
                    f" ({burst['gunicorn_peak_pss_mb']:.0f} / {burst['qcluster_peak_pss_mb']:.0f})"
                    if "qcluster_peak_pss_mb" in burst
                    else ""
                ),
                "< 512 / < 300",
                ok(m["rss"] and m.get("qcluster_rss", False)),
            )
        )
        registered = burst["all_registered_s"]
        last = burst.get("all_responses_s")
        out.append(
            (
                f"burst {n:,}: all {burst['events_expected']:,} events registered, s after the "
                "last answer",
                f"{registered - last:.1f}"
                if registered is not None and last is not None
                else f"not all ({burst['events_registered']:,})",
                f"<= {burst['target'].get('registered_after_last_answer_s', 30):g}",
                ok(m["registered"]),
            )
        )
    sched = load(directory, "scheduler")
    if sched:
        out.append(
            (
                f"scheduler runs/s ({sched['dags']:,} Dags with waiting events)",
                f"{sched['runs_per_s']['median']:,.0f}",
                ">= 200",
                ok(sched["target"]["met"]),
            )
        )
    scaling = load(directory, "drain_scaling")
    if scaling:
        v = [x["events_per_s"]["median"] for x in scaling["results"]]
        out.append(
            (
                "drain scaling events/s with 1 / 2 / 4 drains",
                " / ".join(f"{x:,.0f}" for x in v),
                "no drop",
                ok(scaling["target"]["met"]),
            )
        )
    watcher = load(directory, "watcher")
    if watcher:
        t, lat = watcher["throughput"], watcher["latency_ms"]
        rates = [v["per_second"] for k, v in t.items() if k.startswith("watcher")]
        http = next(v["per_second"] for k, v in t.items() if k.startswith("HTTP"))
        out.append(
            (
                "queue watcher messages/s, 1 / 2 consumer processes (HTTP POST, 8 clients)",
                " / ".join(f"{r:,.0f}" for r in rates) + f" ({http:,.0f})",
                "(issue 28)",
                "",
            )
        )
        w, p = lat["watcher (1 consumer)"], lat["HTTP POST"]
        out.append(
            (
                f"queue watcher publish -> run committed at {watcher['rate_per_s']:g}/s, "
                "p50 / p99 ms (HTTP POST the same way)",
                f"{w['median']:,.0f} / {w['p99']:,.0f} ({p['median']:,.0f} / {p['p99']:,.0f})",
                "(issue 28)",
                "",
            )
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    directory = h.results_dir(args)
    table = rows(directory)
    print("| measure | result | target | |")
    print("|---|---|---|---|")
    for row in table:
        print("| " + " | ".join(row) + " |")
    machines = [
        data["machine"]
        for path in sorted(directory.glob("*.json"))
        if "machine" in (data := json.loads(path.read_text()))
    ]
    if machines:
        loads = [m["load_avg_1m_5m_15m"][0] for m in machines]
        commits = sorted({m["git_commit"] for m in machines})
        print(
            f"\nMeasured on {machines[0]['cpus']} cores, PostgreSQL {machines[0]['postgresql']}, "
            f"commit {', '.join(commits)}; 1-minute load average when each benchmark started: "
            f"{min(loads):.1f} to {max(loads):.1f} (other processes are listed in each JSON)."
        )


if __name__ == "__main__":
    main()
