"""Medians, ratios against the targets, the printed tables, the JSON file and the chart."""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from benchmarks import redisdb
from benchmarks.common import OWN_CONNECTION_LABEL, PLAIN_INSERT_LABEL, SAME_ROW_LABEL, median

TITLES = {
    "asyncq": "asyncq",
    "procrastinate": "procrastinate",
    "pgqueuer": "PgQueuer",
    "oban": "oban-py",
    "saq": "saq (PostgreSQL)",
    "arq": "arq (Redis)",
    "sql": "plain SQL",
}
PEERS = ("procrastinate", "pgqueuer", "oban", "saq", "arq")


def _title(results: dict[str, Any], name: str) -> str:
    return str(results.get("titles", {}).get(name) or TITLES.get(name, name))


def _key(run: dict[str, Any]) -> tuple[Any, ...]:
    p = run["point"]
    return (run["system"], p["concurrency"], p["batch"], p["processes"], p["variant"])


def summarise(results: dict[str, Any]) -> dict[str, Any]:
    """Medians over the repeats, per system and configuration."""
    groups: dict[tuple[Any, ...], list[float]] = defaultdict(list)
    labels: dict[tuple[Any, ...], dict[str, Any]] = {}
    jobs: dict[tuple[Any, ...], int] = {}
    for run in results["throughput"]:
        if run.get("ok"):
            groups[_key(run)].append(run["rate"])
            labels[_key(run)] = run["point"]
            jobs[_key(run)] = run["jobs"]
    throughput = [
        {
            "system": key[0],
            "point": labels[key],
            "median_rate": median(rates),
            "rates": rates,
            "jobs": jobs[key],
        }
        for key, rates in groups.items()
    ]
    best: dict[str, dict[str, Any]] = {}
    for row in throughput:
        name = row["system"]
        if row["point"]["processes"] != 1:
            continue
        if name == "sql" and row["point"]["variant"] != "batched":
            continue
        if name not in best or row["median_rate"] > best[name]["median_rate"]:
            best[name] = row
    default: dict[str, dict[str, Any]] = {}
    for name, point in results.get("defaults", {}).items():
        for row in throughput:
            if row["system"] == name and _same_point(row["point"], point):
                default[name] = row

    latency: dict[str, dict[str, Any]] = {}
    latency_more: list[dict[str, Any]] = []
    primary = [r for r in results["latency"] if not r.get("extra")]
    for name, runs in _by_system(primary).items():
        latency[name] = {
            "p50_ms": median([r["p50_ms"] for r in runs]),
            "p95_ms": median([r["p95_ms"] for r in runs]),
            "runs": len(runs),
            "point": runs[0].get("point"),
        }
    more: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for run in results["latency"]:
        if run.get("extra") and "error" not in run:
            more[(run["system"], run["point"]["label"])].append(run)
    for (name, _label), runs in more.items():
        latency_more.append(
            {
                "system": name,
                "point": runs[0]["point"],
                "p50_ms": median([r["p50_ms"] for r in runs]),
                "p95_ms": median([r["p95_ms"] for r in runs]),
                "runs": len(runs),
            }
        )

    enqueue: dict[str, dict[str, float | None]] = {}
    for name, runs in _by_system(results["enqueue"]).items():
        kinds = {k for r in runs for k in r if k not in ("system", "repeat")}
        enqueue[name] = {k: median([r[k] for r in runs if k in r]) for k in sorted(kinds)}
    return {
        "throughput": throughput,
        "best": best,
        "default": default,
        "latency": latency,
        "latency_more": latency_more,
        "enqueue": enqueue,
    }


def _same_point(a: dict[str, Any], b: dict[str, Any]) -> bool:
    keys = ("concurrency", "batch", "processes", "variant")
    return all(a.get(k) == b.get(k) for k in keys)


def _by_system(runs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    grouped: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for run in runs:
        if "error" not in run:
            grouped[run["system"]].append(run)
    return grouped


def _rate_at(summary: dict[str, Any], system: str, **want: Any) -> float | None:
    rates = [
        row["median_rate"]
        for row in summary["throughput"]
        if row["system"] == system and all(row["point"][k] == v for k, v in want.items())
    ]
    return float(max(rates)) if rates else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def targets(summary: dict[str, Any], results: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target of the issue: the measured value, the bar, and whether it is met."""
    out: list[dict[str, Any]] = []

    def add(name: str, value: float | None, bar: str, met: bool | None, detail: str = "") -> None:
        out.append({"target": name, "value": value, "bar": bar, "met": met, "detail": detail})

    best = summary["best"]
    aq = best.get("asyncq", {}).get("median_rate")
    pgq = best.get("pgqueuer", {}).get("median_rate")
    r = _ratio(aq, pgq)
    if r is not None:
        add(
            "throughput vs PgQueuer best",
            r,
            ">= 2.0x",
            r >= 2.0,
            _best_detail(best, "asyncq") + " vs " + _best_detail(best, "pgqueuer"),
        )
    default = summary.get("default", {})
    r = _ratio(
        default.get("asyncq", {}).get("median_rate"),
        default.get("pgqueuer", {}).get("median_rate"),
    )
    if r is not None:
        add(
            "default config vs PgQueuer's default",
            r,
            ">= 3.0x",
            r >= 3.0,
            _best_detail(default, "asyncq") + " vs " + _best_detail(default, "pgqueuer"),
        )
    for batch in (10, 50, 100):
        a = _rate_at(summary, "asyncq", batch=batch, processes=1)
        s = _rate_at(summary, "sql", batch=batch, processes=1, variant="batched")
        r = _ratio(a, s)
        if r is not None:
            add(
                f"throughput vs plain SQL, batch {batch}",
                r,
                ">= 0.5x",
                r >= 0.5,
                f"{a:,.0f} vs {s:,.0f} jobs/s",
            )
    one = _rate_at(summary, "asyncq", concurrency=100, batch=100, processes=1)
    for procs in (2, 4):
        many = _rate_at(summary, "asyncq", concurrency=100, batch=100, processes=procs)
        r = _ratio(many, one)
        if r is not None and many is not None and one is not None:
            add(
                f"scaling: {procs} processes vs 1 (c=100 b=100 each)",
                r,
                "(shown)",
                None,
                f"{many:,.0f} vs {one:,.0f} jobs/s; {many / aq:.2f}x the best single process"
                if aq
                else f"{many:,.0f} vs {one:,.0f} jobs/s",
            )

    lat = summary["latency"]
    if "asyncq" in lat:
        mine = lat["asyncq"]
        for peer in PEERS:
            if peer in lat:
                for q in ("p50_ms", "p95_ms"):
                    add(
                        f"pickup {q[:3]} below {TITLES[peer]}",
                        mine[q] - lat[peer][q],
                        "< 0 ms",
                        mine[q] < lat[peer][q],
                        f"{mine[q]:.2f} vs {lat[peer][q]:.2f} ms",
                    )
        if "sql" in lat:
            for q in ("p50_ms", "p95_ms"):
                diff = mine[q] - lat["sql"][q]
                add(
                    f"pickup {q[:3]} within 1 ms of LISTEN loop",
                    diff,
                    "<= 1 ms",
                    diff <= 1.0,
                    f"{mine[q]:.2f} vs {lat['sql'][q]:.2f} ms",
                )

    enq = summary["enqueue"]
    if "asyncq" in enq:
        a = enq["asyncq"]
        defer = a.get("one_by_one")

        def versus(name: str, reference: float | None, *, target: bool) -> None:
            r = _ratio(defer, reference)
            add(
                f"defer one-by-one vs {name}",
                r,
                ">= 0.9x" if target else "(shown)",
                None if r is None or not target else r >= 0.9,
                f"{defer or 0:,.0f} vs {reference or 0:,.0f}/s",
            )

        # The plain INSERT timed in turns with the defers is the target's reference: the
        # ratio is not moved by the machine's drift, as one with the plain-SQL system is.
        if a.get(PLAIN_INSERT_LABEL):
            versus("plain INSERT (in turns)", a[PLAIN_INSERT_LABEL], target=True)
        if a.get(SAME_ROW_LABEL):
            versus("INSERT of the same row", a[SAME_ROW_LABEL], target=False)
        if "sql" in enq:  # timed in another phase: it follows the disk's flushes' drift
            reference = enq["sql"].get("one_by_one")
            versus("plain SQL system's INSERT", reference, target=not a.get(PLAIN_INSERT_LABEL))
        r = _ratio(a.get("concurrent"), a.get("one_by_one"))
        add(
            "defer from 50 coroutines vs one-by-one",
            r,
            ">= 3.0x",
            None if r is None else r >= 3.0,
            f"{a.get('concurrent') or 0:,.0f} vs {a.get('one_by_one') or 0:,.0f}/s",
        )
        bulk = a.get("bulk")
        add("defer_many jobs/s", bulk, ">= 100,000/s", None if bulk is None else bulk >= 100_000)

    ceiling = results.get("ceiling")
    if ceiling and "rounds" in ceiling:
        for procs, key, bar in ((1, "one_vs_sql", 0.75), (2, "two_vs_sql", 0.9)):
            r = ceiling[f"{key}_median"]
            add(
                f"{procs} process{'es' if procs > 1 else ''} vs plain SQL, back to back",
                r,
                f">= {bar:.2f}x",
                r >= bar,
                "rounds " + " ".join(f"{x:.2f}" for x in ceiling[key]),
            )
        bulk = ceiling["bulk"]
        add(
            "defer_many jobs/s, in turns with a bulk INSERT",
            bulk["defer_many"],
            ">= 150,000/s",
            bulk["defer_many"] >= 150_000,
            f"{bulk['ratio']:.2f}x the bulk INSERT's {bulk['bulk_insert']:,.0f}/s",
        )
    history = results.get("history")
    if history and "cases" in history:
        cases = {c["case"]: c for c in history["cases"]}
        steady = cases.get("done rows, vacuumed")
        if steady:
            rows = f"{history['rows']:,} done rows"
            add(
                f"claim time, {rows} vs empty",
                steady["time_ratio"],
                "<= 2.0x",
                steady["time_ratio"] <= 2.0,
                f"{steady['median_execution_ms']:.2f}"
                f" vs {cases['empty']['median_execution_ms']:.2f} ms",
            )
            add(
                f"claim buffers, {rows} vs empty",
                steady["buffer_ratio"],
                "<= 2.0x",
                steady["buffer_ratio"] <= 2.0,
                f"{steady['median_buffers']:.0f} vs {cases['empty']['median_buffers']:.0f}",
            )
        drain = history.get("drain", {})
        if "seq_scan_delta" in drain:
            add(
                "seq scans of asyncq_jobs during a drain",
                drain["seq_scan_delta"],
                "0",
                drain["seq_scan_delta"] == 0,
                f"{drain['jobs']:,} jobs over {drain['history_rows']:,} done rows",
            )
    memory = results.get("memory")
    if memory and "growth_after_warm_mb" in memory:
        growth = memory["growth_after_warm_mb"]
        add(
            f"worker RSS growth over {memory['jobs']:,} jobs",
            growth,
            "flat (< 10 MB)",
            growth < 10,
            f"{memory['rss_warm_mb']:.1f} -> {memory['rss_end_mb']:.1f} MB",
        )
    return out


def _best_detail(best: dict[str, Any], name: str) -> str:
    row = best.get(name)
    if not row:
        return f"{name}: n/a"
    return f"{row['median_rate']:,.0f} jobs/s ({_label(row['point'])})"


def _label(point: dict[str, Any]) -> str:
    c = point["concurrency"]
    text = f"c={c if c else 'unlimited'}"
    if point["batch"] == 0:
        text += " b=default"
    elif point["batch"] != 1:
        text += f" b={point['batch']}"
    if point["processes"] > 1:
        text += f" x{point['processes']} proc"
    return f"{text} {point['variant']}".strip()


# -- before and after (--baseline) -------------------------------------------------------

CURRENT = "asyncq"
BASELINE = "baseline"


def _pair(
    measure: str,
    unit: str,
    current: dict[int, float],
    baseline: dict[int, float],
    how: str,
) -> dict[str, Any]:
    """One measure: the medians over the rounds, their ratio, each round's ratio and the
    median of those."""
    cur, base = median(list(current.values())), median(list(baseline.values()))
    rounds = [
        round(current[r] / baseline[r], 4)
        for r in sorted(current.keys() & baseline.keys())
        if baseline[r]
    ]
    return {
        "measure": measure,
        "unit": unit,
        "current": cur,
        "baseline": base,
        "ratio": _ratio(cur, base),
        "rounds": rounds,
        "rounds_median": median(rounds),
        "how": how,
    }


def before_after(results: dict[str, Any]) -> dict[str, Any]:
    """asyncq (the working tree) against asyncq at the baseline commit, measure by measure.

    ratio = current / baseline of the medians over the rounds; "rounds" has the ratio of
    each round's pair, "rounds_median" their median. "how": "back to back" for the
    drains (one right after the other); "interleaved" for pickup samples and enqueue
    calls or blocks, which take turns (`measure.latency_in_turns`, `.enqueue_in_turns`).
    """
    rows: list[dict[str, Any]] = []

    def by_round(runs: list[dict[str, Any]], system: str, value: Any) -> dict[int, float]:
        out = {}
        for run in runs:
            if run["system"] == system and "error" not in run:
                v = value(run)
                if v is not None:
                    out[run["repeat"]] = float(v)
        return out

    points: dict[str, dict[str, Any]] = {}
    for run in results["throughput"]:
        if run["system"] in (CURRENT, BASELINE):
            points.setdefault(run["point"]["label"], run["point"])
    for label, point in points.items():
        ok = [r for r in results["throughput"] if r.get("ok") and r["point"]["label"] == label]
        rows.append(
            _pair(
                f"throughput {_label(point)}",
                "jobs/s",
                by_round(ok, CURRENT, lambda r: r["rate"]),
                by_round(ok, BASELINE, lambda r: r["rate"]),
                "back to back",
            )
        )
    for q in ("p50_ms", "p95_ms"):
        rows.append(
            _pair(
                f"pickup {q[:3]}",
                "ms",
                by_round(results["latency"], CURRENT, lambda r, q=q: r.get(q)),
                by_round(results["latency"], BASELINE, lambda r, q=q: r.get(q)),
                "interleaved",
            )
        )
    enqueue = results["enqueue"]
    for measure, key in (
        ("defer() one by one", "one_by_one"),
        (OWN_CONNECTION_LABEL + " one by one", OWN_CONNECTION_LABEL),
        ("defer() from 50 coroutines", "concurrent"),
        ("defer_many (bulk)", "bulk"),
    ):
        rows.append(
            _pair(
                measure,
                "jobs/s",
                by_round(enqueue, CURRENT, lambda r, k=key: r.get(k)),
                by_round(enqueue, BASELINE, lambda r, k=key: r.get(k)),
                "interleaved",
            )
        )
    rows = [r for r in rows if r["current"] is not None or r["baseline"] is not None]
    return {
        "current": _title(results, CURRENT),
        "baseline": _title(results, BASELINE),
        "ratio": "current / baseline",
        "rows": rows,
    }


def _render_before_after(results: dict[str, Any]) -> str:
    data = results["before_after"]
    meta = results["meta"]
    git = meta.get("git", {})
    base = meta.get("baseline") or {}
    here = f"the working tree at {git.get('commit', '?')}"
    here += ", asyncq/ with uncommitted changes" if git.get("asyncq_dirty") else ""
    code = results.get("code", {})
    head = (
        f"before/after: {data['current']} ({here}) against {data['baseline']}"
        f" ({base.get('subject', '?')})\n"
        f"  code: {code.get(CURRENT, '?')} against {code.get(BASELINE, '?')}"
        " (every worker process says which it ran)\n"
        "  ratio = current / baseline of the medians (for jobs/s above 1.00x is faster,"
        " for ms above 1.00x is slower);\n  per round: the ratio of each round's pair,"
        " and their median"
    )
    rows = [
        [
            r["measure"],
            r["unit"],
            _fmt(r["current"], ",.2f" if r["unit"] == "ms" else ",.0f"),
            _fmt(r["baseline"], ",.2f" if r["unit"] == "ms" else ",.0f"),
            _fmt(r["ratio"], ".3f") + ("x" if r["ratio"] is not None else ""),
            _fmt(r.get("rounds_median"), ".3f") + ("x" if r.get("rounds_median") else ""),
            " ".join(f"{x:.3f}" for x in r["rounds"]) or "-",
            r["how"],
        ]
        for r in data["rows"]
    ]
    table = _table(
        [
            "before/after",
            "unit",
            data["current"],
            data["baseline"],
            "ratio",
            "rounds' median",
            "per round",
            "how",
        ],
        rows,
    )
    return head + "\n" + table


# -- printing ----------------------------------------------------------------------------


def _version(meta: dict[str, Any]) -> str:
    return str(meta["server"].get("server_version", "?")).split()[0]


def _fmt(value: float | None, spec: str = ",.0f") -> str:
    return "-" if value is None else format(value, spec)


def _table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)
    ]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    rule = "  ".join("-" * w for w in widths)
    body = [
        "  ".join(
            c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in rows
    ]
    return "\n".join([line, rule, *body])


def render(results: dict[str, Any]) -> str:
    summary = results["summary"]
    meta = results["meta"]
    parts: list[str] = []
    parts.append(
        f"asyncq benchmarks ({meta['mode']} mode, medians of {meta['repeats']} runs,"
        f" {meta['jobs']:,} jobs per drain) on PostgreSQL {_version(meta)},"
        f" {meta['machine']['cores']} cores"
    )
    rows = []
    notes = results.get("bulk_notes", {})
    for name in results["systems"]:
        best = summary["best"].get(name)
        default = summary.get("default", {}).get(name)
        lat = summary["latency"].get(name, {})
        enq = summary["enqueue"].get(name, {})
        rows.append(
            [
                _title(results, name),
                _fmt(best and best["median_rate"]),
                _label(best["point"]) if best else "-",
                _fmt(default and default["median_rate"]),
                _label(default["point"]) if default else "-",
                _fmt(lat.get("p50_ms"), ".2f"),
                _fmt(lat.get("p95_ms"), ".2f"),
                _fmt(enq.get("one_by_one")),
                _fmt(enq.get("concurrent")),
                notes[name] if name in notes and enq else _fmt(enq.get("bulk")),
            ]
        )
    parts.append(
        _table(
            [
                "system",
                "jobs/s (best)",
                "best config",
                "jobs/s (default)",
                "default config",
                "pickup p50 ms",
                "p95 ms",
                "enqueue 1-by-1/s",
                "50 coroutines/s",
                "bulk/s",
            ],
            rows,
        )
    )
    more = summary.get("latency_more", [])
    if more:
        parts.append(
            _table(
                ["other pickup configurations", "config", "p50 ms", "p95 ms"],
                [
                    [
                        _title(results, r["system"]),
                        _label(r["point"]),
                        _fmt(r["p50_ms"], ".2f"),
                        _fmt(r["p95_ms"], ".2f"),
                    ]
                    for r in more
                ],
            )
        )
    if results.get("redis"):
        parts.append("arq's durability: " + redisdb.durability(results["redis"]) + ".")
    extras = [
        [_title(results, n) + ": " + k, _fmt(v)]
        for n, enq in summary["enqueue"].items()
        for k, v in enq.items()
        if k not in ("one_by_one", "concurrent", "bulk")
    ]
    if extras:
        parts.append(_table(["other enqueue variants", "jobs/s"], extras))
    if results.get("before_after"):
        parts.append(_render_before_after(results))

    sweep = sorted(
        summary["throughput"],
        key=lambda r: (
            results["systems"].index(r["system"]) if r["system"] in results["systems"] else 9,
            r["point"]["processes"],
            r["point"]["variant"],
            r["point"]["concurrency"],
            r["point"]["batch"],
        ),
    )
    defaults = results.get("defaults", {})
    parts.append(
        _table(
            ["throughput sweep", "config", "jobs", "median jobs/s", "runs"],
            [
                [
                    _title(results, r["system"]),
                    _label(r["point"])
                    + (
                        " (default)"
                        if _same_point(r["point"], defaults.get(r["system"], {}))
                        else ""
                    ),
                    f"{r.get('jobs', 0):,}",
                    _fmt(r["median_rate"]),
                    " ".join(f"{x:,.0f}" for x in r["rates"]),
                ]
                for r in sweep
            ],
        )
    )
    if results.get("shape"):
        from benchmarks import shape

        if "rows" in results["shape"]:
            parts.append(shape.render(results["shape"], durability=not results.get("redis")))

    ceiling = results.get("ceiling")
    if ceiling and "rounds" in ceiling:
        points = ceiling["points"]
        rows = [
            [
                str(i),
                *(_fmt(r[key]) for key in points),
                f"{one:.2f}x",
                f"{two:.2f}x",
            ]
            for i, (r, one, two) in enumerate(
                zip(ceiling["rounds"], ceiling["one_vs_sql"], ceiling["two_vs_sql"], strict=True),
                start=1,
            )
        ]
        rows.append(
            [
                "median",
                *(_fmt(statistics.median(r[key] for r in ceiling["rounds"])) for key in points),
                f"{ceiling['one_vs_sql_median']:.2f}x",
                f"{ceiling['two_vs_sql_median']:.2f}x",
            ]
        )
        headers = [f"{key} ({label})" for key, label in points.items()]
        parts.append(
            f"ceiling: asyncq and plain SQL back to back ({ceiling['jobs']:,} jobs per drain)\n"
            + _table(["round", *headers, "1 process vs SQL", "2 processes vs SQL"], rows)
        )
        bulk = ceiling["bulk"]
        parts.append(
            f"bulk in turns (calls of {bulk['chunk']:,}): defer_many {bulk['defer_many']:,.0f}/s,"
            f" plain bulk INSERT {bulk['bulk_insert']:,.0f}/s ({bulk['ratio']:.2f}x;"
            f" blocks {' '.join(f'{r:.2f}' for r in bulk['block_ratios'])})"
        )
    starts_table = render_starts(results)
    if starts_table:
        parts.append(starts_table)
    river_text = render_river(results)
    if river_text:
        parts.append(river_text)
    history = results.get("history")
    if history and "cases" in history:
        rows = [
            [
                c["case"],
                f"{c['median_execution_ms']:.2f}",
                f"{c['first']['execution_ms']:.2f}",
                f"{c['median_buffers']:.0f}",
                f"{c['time_ratio']:.2f}x",
                f"{c['buffer_ratio']:.2f}x",
                "yes" if c["seq_scan_in_plan"] else "no",
            ]
            for c in history["cases"]
        ]
        parts.append(
            f"claim of {history['claim_limit']} with {history['backlog']:,} queued"
            f" and {history['rows']:,} finished rows (EXPLAIN ANALYZE, BUFFERS)\n"
            + _table(
                [
                    "table",
                    "ms (median)",
                    "ms (1st)",
                    "buffers",
                    "time vs empty",
                    "buffers vs empty",
                    "seq scan in plan",
                ],
                rows,
            )
        )
        drain = history["drain"]
        parts.append(
            f"drain of {drain['jobs']:,} jobs over {drain['history_rows']:,} done rows"
            f" ({drain['point']}): {drain['rate_to_exit']:,.0f} jobs/s to exit,"
            f" seq_scan +{drain['seq_scan_delta']}, idx_scan +{drain['idx_scan_delta']}"
        )
    memory = results.get("memory")
    if memory and "rss_end_mb" in memory:
        parts.append(
            f"memory: {memory['jobs']:,} jobs in {memory['seconds']:.0f}s"
            f" ({memory['rate']:,.0f}/s); worker RSS {memory['rss_start_mb']:.1f} MB at start,"
            f" {memory['rss_warm_mb']:.1f} after 10%,"
            f" {memory['rss_end_mb']:.1f} at the end (max {memory['rss_max_mb']:.1f});"
            f" slope {_fmt(memory['slope_mb_per_100k_jobs'], '.2f')} MB per 100k jobs"
        )
    checks = results["targets"]
    if checks:
        rows = [
            [
                t["target"],
                _fmt(t["value"], ",.2f"),
                t["bar"],
                {True: "met", False: "MISSED", None: "-"}[t["met"]],
                t["detail"],
            ]
            for t in checks
        ]
        parts.append(_table(["target (asyncq)", "value", "bar", "", "measured"], rows))
    if results["errors"]:
        parts.append("problems:\n" + "\n".join(f"  {e}" for e in results["errors"]))
    return "\n\n".join(parts)


STATES = ("empty", "warm", "backlog", "history")


def starts_summary(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Per system and configuration: the median rate from each start state, the worst
    state, and the lowest of the states' ratios to plain SQL's and to River's rates."""
    rates: dict[tuple[str, str], dict[str, list[float]]] = {}
    for run in results.get("starts", []):
        if run.get("ok"):
            key = (run["system"], run.get("label") or _label(run["point"]))
            rates.setdefault(key, {}).setdefault(run["state"], []).append(run["rate"])
    medians = {
        key: {state: statistics.median(r) for state, r in by_state.items()}
        for key, by_state in rates.items()
    }

    def reference(name: str) -> dict[str, float]:
        """The system's best configuration's rate in each state."""
        best: dict[str, float] = {}
        for (system, _), by_state in medians.items():
            if system == name:
                for state, rate in by_state.items():
                    best[state] = max(rate, best.get(state, 0.0))
        return best

    sql, river = reference("sql"), reference("river")
    rows = []
    for (system, point), by_state in medians.items():
        worst = min(by_state, key=lambda state: by_state[state])

        def lowest(ref: dict[str, float], by_state: dict[str, float] = by_state) -> Any:
            ratios = [by_state[s] / ref[s] for s in by_state if ref.get(s)]
            return min(ratios) if ratios else None

        rows.append(
            {
                "system": system,
                "point": point,
                "rates": by_state,
                "worst_state": worst,
                "worst": by_state[worst],
                "vs_sql": None if system == "sql" else lowest(sql),
                "vs_river": None if system == "river" else lowest(river),
                "runs": {state: len(r) for state, r in rates[(system, point)].items()},
            }
        )
    return rows


def render_starts(results: dict[str, Any]) -> str:
    summary = starts_summary(results)
    if not summary:
        return ""
    states = [s for s in STATES if any(s in row["rates"] for row in summary)]
    rows = [
        [
            _title(results, row["system"]),
            row["point"],
            *(_fmt(row["rates"].get(state)) for state in states),
            f"{_fmt(row['worst'])} ({row['worst_state']})",
            _fmt(row["vs_sql"], ".2f") + ("x" if row["vs_sql"] is not None else ""),
            _fmt(row["vs_river"], ".2f") + ("x" if row["vs_river"] is not None else ""),
        ]
        for row in summary
    ]
    runs = [r for r in results.get("starts", []) if r.get("ok")]
    loads = [r["load"] for r in runs if "load" in r]
    sizes = results.get("meta", {}).get("starts", {})
    head = (
        "start states, jobs/s (medians): empty = workers started on the analyzed empty table,"
        " then the burst; warm = the burst analyzed before the workers start; backlog ="
        f" {sizes.get('backlog_jobs', 0):,} queued when they start; history = the burst"
        f" over {sizes.get('finished_jobs', 0):,} finished jobs; burst {sizes.get('burst', 0):,}"
    )
    if loads:
        head += f"; load average {min(loads):.2f}-{max(loads):.2f}"
    counts = sorted({n for row in summary for n in row["runs"].values()})
    head += f"; runs per cell {'-'.join(str(n) for n in (counts[0], counts[-1]) if n) or 0}"
    table = _table(
        [
            "system",
            "configuration",
            *states,
            "worst (state)",
            "vs plain SQL (lowest)",
            "vs River (lowest)",
        ],
        rows,
    )
    return head + "\n" + table


def render_river(results: dict[str, Any]) -> str:
    """River's stock `river bench`, and what River does where its CLI measures nothing."""
    meta = results.get("river_meta")
    if not meta:
        return ""
    runs = [r for r in results.get("river", []) if r.get("ok")]
    settings = meta["settings"]
    defaults = meta["defaults"]
    text = (
        f"River {meta['version']} (`river bench`, its stock settings: MaxWorkers"
        f" {settings['max_workers']:,}, FetchCooldown {settings['fetch_cooldown_ms']} ms,"
        f" FetchPollInterval {settings['fetch_poll_interval_ms']} ms, {settings['pool']};"
        f" {settings['insert']}; TRUNCATE and VACUUM FULL of river_job first)"
    )
    if runs:
        rates = [r["rate"] for r in runs]
        text += (
            f": {statistics.median(rates):,.0f} jobs/s (median of {len(rates)}:"
            f" {', '.join(f'{r:,.0f}' for r in rates)}; {runs[0]['jobs']:,} jobs)"
        )
    pickup = river_pickup_summary(results)
    if not pickup:
        return text + (
            "\nRiver's pickup is not measured (no river-pickup beside its CLI): an idle"
            " client fetches on a LISTEN notification of an insert or every FetchPollInterval"
            f" ({defaults['fetch_poll_interval_ms']:,} ms by default), at most once per"
            f" FetchCooldown ({defaults['fetch_cooldown_ms']} ms by default,"
            f" {settings['fetch_cooldown_ms']} ms in its bench's tuning)"
        )
    rows = [
        [
            f"River, {setting}",
            f"FetchCooldown {row['fetch_cooldown_ms']:g} ms,"
            f" FetchPollInterval {row['fetch_poll_interval_ms']:g} ms",
            _fmt(row["p50_ms"], ".2f"),
            _fmt(row["p95_ms"], ".2f"),
            str(row["runs"]),
        ]
        for setting, row in pickup.items()
    ]
    return (
        text + "\nRiver's pickup (river-pickup: an idle client, one queue, a no-op worker; one job"
        " at a time, 10-20 ms apart; from just before Insert to Work's first line)\n"
        + _table(["system", "client settings", "p50 ms", "p95 ms", "runs"], rows)
    )


def river_pickup_summary(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """River's pickup per client setting: medians over the runs of their p50 and p95."""
    runs: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for run in results.get("river_pickup", []):
        if "error" not in run:
            runs[run["setting"]].append(run)
    return {
        setting: {
            "p50_ms": median([r["p50_ms"] for r in found]),
            "p95_ms": median([r["p95_ms"] for r in found]),
            "fetch_cooldown_ms": found[0]["fetch_cooldown_ms"],
            "fetch_poll_interval_ms": found[0]["fetch_poll_interval_ms"],
            "runs": len(found),
        }
        for setting, found in runs.items()
    }


def write_json(results: dict[str, Any], out_dir: Path, stamp: str) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    text = json.dumps(results, indent=1, default=str)
    paths = [out_dir / f"{stamp}.json", out_dir / "latest.json"]
    for path in paths:
        path.write_text(text)
    return paths


def chart(results: dict[str, Any], path: Path) -> str | None:
    """Throughput against batch size, concurrency and processes; None, or why not drawn."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install -e '.[bench]')"
    rows = results["summary"]["throughput"]
    fig, axes = plt.subplots(1, 3, figsize=(16, 5.2))
    colors = {
        "asyncq": "tab:blue",
        "procrastinate": "tab:orange",
        "pgqueuer": "tab:green",
        "oban": "tab:purple",
        "saq": "tab:brown",
        "arq": "tab:red",
        "sql": "tab:gray",
    }

    def series(system: str, x: str, **fixed: Any) -> tuple[list[int], list[float]]:
        pts = sorted(
            (r["point"][x], r["median_rate"])
            for r in rows
            if r["system"] == system
            and r["point"]["batch"] != 0  # a system's own default batch: no place on an axis
            and all(r["point"][k] == v for k, v in fixed.items())
        )
        return [p[0] for p in pts], [p[1] for p in pts]

    ax = axes[0]
    for c, style in ((10, ":"), (50, "--"), (100, "-"), (200, "-.")):
        xs, ys = series("asyncq", "batch", concurrency=c, processes=1)
        if xs:
            ax.plot(xs, ys, style, marker="o", color=colors["asyncq"], label=f"asyncq c={c}")
    xs, ys = series("pgqueuer", "batch", processes=1)
    if xs:
        ax.plot(xs, ys, marker="s", color=colors["pgqueuer"], label="PgQueuer (tasks uncapped)")
    for variant, style in (("batched", "-"), ("per-job", "--")):
        xs, ys = series("sql", "batch", processes=1, variant=variant)
        if xs:
            ax.plot(
                xs,
                ys,
                style,
                marker="^",
                color=colors["sql"],
                label=f"plain SQL, 10 coroutines, {variant}",
            )
    ax.set(
        title="by batch size (jobs claimed per query)",
        xlabel="batch size",
        ylabel="jobs/s (median)",
    )

    ax = axes[1]
    for b, style in ((10, ":"), (50, "--"), (100, "-")):
        xs, ys = series("asyncq", "concurrency", batch=b, processes=1)
        if xs:
            ax.plot(xs, ys, style, marker="o", color=colors["asyncq"], label=f"asyncq b={b}")
    for system, fixed, marker, label in (
        ("procrastinate", {}, "D", "procrastinate (1 job per fetch)"),
        ("oban", {}, "v", "oban-py (queue limit)"),
        ("saq", {}, "P", "saq on PostgreSQL"),
        ("arq", {"variant": "poll=10ms"}, "X", "arq on Redis, poll 10 ms (max_jobs)"),
        ("arq", {"variant": ""}, "x", "arq on Redis, default poll 0.5 s"),
    ):
        xs, ys = series(system, "concurrency", processes=1, **fixed)
        if xs:
            ax.plot(xs, ys, marker=marker, color=colors[system], label=label)
    ax.set(
        title="by concurrency (jobs run at once)", xlabel="concurrency", ylabel="jobs/s (median)"
    )

    ax = axes[2]
    for system, fixed, label in (
        ("asyncq", {"concurrency": 100, "batch": 100}, "asyncq c=100 b=100"),
        ("sql", {"batch": 100, "variant": "batched"}, "plain SQL b=100 batched"),
    ):
        xs, ys = series(system, "processes", **fixed)
        if xs:
            ax.plot(xs, ys, marker="o", color=colors[system], label=label)
    ax.set(title="by worker processes", xlabel="worker processes", ylabel="jobs/s (median)")

    # Concurrency runs from 1 (procrastinate's default) to 200: a log axis.
    axes[1].set_xscale("log")
    for ax in axes:
        xs = sorted({int(x) for line in ax.get_lines() for x in line.get_xdata()})
        if xs:
            ax.set_xticks(xs)
            ax.set_xticklabels([str(x) for x in xs])
            ax.minorticks_off()
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
        if ax.has_data():
            ax.legend(fontsize=8)
    meta = results["meta"]
    fig.suptitle(
        f"No-op jobs, one worker process unless noted: {meta['jobs']:,} jobs per drain,"
        f" medians of {meta['repeats']} runs, PostgreSQL {_version(meta)},"
        f" {meta['machine']['cores']} cores"
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None
