"""The sample outputs of README.md and docs/, from real runs.

A fenced block that shows what a command prints is marked, on the line before it, with
the name of its sample::

    <!-- sample: steering -->
    ```
    ...
    ```

Each sample is made here, by `SCENARIOS`: a scenario runs its commands in order (the
examples, the ``asyncq`` command), from the repository's root, on a database of its own
that it makes on the server and drops afterwards, and a sample is what some of them
printed (the ``$ command`` line first when the page shows it). Then::

    python -m tests.samples            # compare every marked block with a new run
    python -m tests.samples --write    # rewrite the blocks with it (make samples)
    python -m tests.samples --only steering,workflows

The server is ``--dsn``, else ``$ASYNCQ_TEST_DSN``, else the embedded PostgreSQL. The
quick start runs on the embedded PostgreSQL whatever the server, as the README's command
does (skipped, and not written, without ``asyncq[embedded]``).

The comparison is of what a change of asyncq could make stale: the words, the columns,
the lines. What differs from run to run by nature is masked on both sides before it
(times, durations, worker ids, process ids, trace ids, sizes, the DSN, where a log line
falls among the printed ones; per sample, every number, or the order of every line), and
runs of spaces count as one.
What is written is the run's own output, but for the name of the database it made,
shown as ``asyncq_samples``. tests/acceptance/test_doc_samples.py runs the comparison.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import os
import re
import secrets
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from psycopg.conninfo import make_conninfo

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
SHOWN_DATABASE = "asyncq_samples"
BLOCK = re.compile(r"^<!-- sample: ([\w-]+) -->\n(```[^\n]*)\n(.*?)^```$", re.M | re.S)
TIMEOUT = 120


def pages() -> list[Path]:
    """Where samples are shown."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


# -- what a sample shows of a run ----------------------------------------------------

Show = Callable[[str], str]


def as_is(text: str) -> str:
    return text


def without(*patterns: str) -> Show:
    """The output less the lines that match any of ``patterns``."""
    compiled = [re.compile(p) for p in patterns]

    def show(text: str) -> str:
        lines = text.splitlines()
        return "\n".join(line for line in lines if not any(p.search(line) for p in compiled))

    return show


# The log lines every process of the App writes first: which database, the migrations.
SETUP = r"INFO +asyncq\.(app|migrate|embedded): (using|applied)"
INFO = r"^(\S+ \S+ )?INFO "


def from_line(start: str) -> Show:
    """The output from the first line that starts with ``start``."""

    def show(text: str) -> str:
        lines = text.splitlines()
        first = next(i for i, line in enumerate(lines) if line.startswith(start))
        return "\n".join(lines[first:])

    return show


def only(*patterns: str) -> Show:
    """The lines that match one of ``patterns``, each run of the others shown as
    ``...``."""
    compiled = [re.compile(p) for p in patterns]

    def show(text: str) -> str:
        shown: list[str] = []
        for line in text.splitlines():
            if any(p.search(line) for p in compiled):
                shown.append(line)
            elif not shown or shown[-1] != "...":
                shown.append("...")
        return "\n".join(shown)

    return show


def fields(*names: str) -> Show:
    """``asyncq job``'s fields named (each with its lines below it), each run of the
    others shown as ``...``."""
    label = re.compile(r"^ *([a-z_]+)(  |$)")

    def show(text: str) -> str:
        lines = text.splitlines()
        width = len(lines[0]) - len(lines[0].lstrip()) + len("id")  # the labels' right edge
        shown: list[str] = []
        current = ""
        for line in lines:
            found = label.match(line)
            if found and found.end(1) == width:
                current = found.group(1)
            if current in names:
                shown.append(line)
            elif not shown or shown[-1] != "...":
                shown.append("...")
        return "\n".join(shown)

    return show


def spans(text: str) -> str:
    """``ConsoleSpanExporter``'s spans without their times, status, events, resource,
    trace state, and the fields they leave empty."""
    import json

    decoder = json.JSONDecoder()
    shown, at = [], 0
    while (at := text.find("{", at)) != -1:
        span, at = decoder.raw_decode(text, at)
        for key in ("start_time", "end_time", "status", "events", "resource"):
            span.pop(key, None)
        span["context"].pop("trace_state", None)
        for link in span.get("links", []):
            link.pop("attributes", None)
            link["context"].pop("trace_state", None)
        shown.append(json.dumps({k: v for k, v in span.items() if v != {} and v != []}, indent=4))
    return "\n".join(shown)


# -- scenarios -------------------------------------------------------------------------


@dataclass
class Context:
    """A scenario's run: its database, and what its steps leave open until it ends."""

    dsn: str
    env: dict[str, str]
    closing: contextlib.ExitStack
    outputs: dict[str, list[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class Run:
    """A command. With ``sample``, its output is (part of) that sample: what ``show``
    keeps of it, after ``$ command`` with ``prompt``. ``command`` is as a reader types
    it (``asyncq ...``, ``python ...``); ``argv`` replaces it for a command not shown."""

    command: str
    sample: str | None = None
    prompt: bool = False
    show: Show = as_is
    stdout_only: bool = False
    returncode: int = 0
    argv: tuple[str, ...] = ()

    def __call__(self, ctx: Context) -> None:
        argv = list(self.argv) or shlex.split(self.command)
        if argv[0] == "python":
            argv[0] = sys.executable
        elif argv[0] == "asyncq":
            argv[0] = str(BIN / "asyncq")
        done = subprocess.run(
            argv,
            cwd=ROOT,
            env=ctx.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL if self.stdout_only else subprocess.STDOUT,
            text=True,
            timeout=TIMEOUT,
            check=False,
        )
        if done.returncode != self.returncode:
            raise SystemExit(
                f"`{self.command}` exited {done.returncode}, not {self.returncode}:\n{done.stdout}"
            )
        if self.sample is None:
            return
        text = self.show(done.stdout).rstrip()
        if self.prompt:
            text = f"$ {self.command}\n{text}"
        ctx.outputs.setdefault(self.sample, []).append(text)


def python(code: str) -> Run:
    """A step that runs ``code`` in a Python process of the scenario (not shown)."""
    return Run("python -c ...", argv=(sys.executable, "-c", code))


def sql(statement: str) -> Callable[[Context], None]:
    def step(ctx: Context) -> None:
        with psycopg.connect(ctx.dsn, autocommit=True) as conn:
            conn.execute(statement)

    return step


def hold_a_snapshot(ctx: Context) -> None:
    """A session that takes a snapshot and stays idle in its transaction until the
    scenario ends, long enough for ``--max-snapshot-age 1s``."""
    holder = ctx.closing.enter_context(psycopg.connect(ctx.dsn))
    holder.execute("SET application_name = 'forgotten report'")
    holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    holder.execute("SELECT count(*) FROM asyncq_jobs").fetchone()
    ctx.closing.callback(holder.rollback)


def until(query: str, what: str) -> Callable[[Context], None]:
    """Wait until ``query`` returns true."""

    def step(ctx: Context) -> None:
        deadline = time.monotonic() + 30
        with psycopg.connect(ctx.dsn, autocommit=True) as conn:
            while not (conn.execute(query).fetchone() or (False,))[0]:
                if time.monotonic() > deadline:
                    raise SystemExit(f"gave up waiting for {what}")
                time.sleep(0.05)

    return step


def as_user(name: str) -> Callable[[Context], None]:
    """The scenario's later commands run as the OS user ``name`` (what a bulk action's
    audit record names), whoever runs the scenario."""

    def step(ctx: Context) -> None:
        ctx.env["LOGNAME"] = ctx.env["USER"] = name

    return step


Step = Callable[[Context], None]


@dataclass(frozen=True)
class Scenario:
    name: str
    steps: tuple[Step, ...]
    embedded: bool = False  # on the embedded PostgreSQL, as the README's quick start


@dataclass(frozen=True)
class Sample:
    """How a sample is compared: ``numbers`` masks every number (what counts rows,
    dead tuples, sizes, ids of a busy table), ``unordered`` compares its lines as a set
    (log lines of jobs that run at once), and lines matching ``volatile`` are left out
    (the quick start's progress)."""

    numbers: bool = False
    unordered: bool = False
    volatile: tuple[str, ...] = ()


SAMPLES: dict[str, Sample] = {
    "quickstart": Sample(volatile=(r"^jobs done: \d+/\d+$",)),
    "schema-not-migrated": Sample(),
    "steering": Sample(),
    "cancel": Sample(),
    "requeue": Sample(),
    # Jobs that end across a minute's turn are counted in two rows of the minute.
    "operate-cli": Sample(numbers=True, volatile=(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d( +\d+){3}$",)),
    # Where the lines around the two shown fall depends on what else the table holds.
    "stats-snapshot": Sample(numbers=True, volatile=(r"^\.\.\.$",)),
    "json-logs": Sample(),
    "results": Sample(),
    "limits": Sample(),
    "periodic": Sample(),
    "schedules": Sample(),
    "sync-tasks": Sample(numbers=True, unordered=True),  # threads race
    "tracing": Sample(),
    "sqlalchemy-orders": Sample(),
    "order-saga": Sample(),
    "fan-out": Sample(numbers=True),
    "batch-import": Sample(),
    "saga-retry": Sample(),
    "saga-job": Sample(),
    "batch-job": Sample(),
    "workflow-job": Sample(),
    "workflow-retry": Sample(),
    "bulk-cli": Sample(),
    "audit-cli": Sample(),
}

SCHEDULED_IMPORTS = """
import asyncio
from examples.batch_import import app, import_file, report

async def main():
    async with app:
        imports = await import_file.options(delay=3600).defer_many(
            [{"path": f"orders-{n}.csv"} for n in (1, 2, 3)]
        )
        await report.options(after=imports, on_parent_failure="run").defer("2026-12-01", imports)

asyncio.run(main())
"""

A_FEED = """
import asyncio
from examples.steering import app, parse_feed

async def main():
    async with app:
        await parse_feed.defer("https://example.com/feed.xml")

asyncio.run(main())
"""

HARNESS = "tests.harness.workflow_app:app"


def harness(code: str) -> Run:
    return python(
        "import anyio, asyncq\n"
        "from tests.harness import workflow_app as flow\n"
        "async def main():\n"
        "    async with flow.app:\n"
        + "".join(f"        {line}\n" for line in code.strip().splitlines())
        + "anyio.run(main)\n"
    )


SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        "quickstart",
        (
            Run(
                "python examples/quickstart.py",
                sample="quickstart",
                show=without(r"asyncq\.migrate: applied migration"),
            ),
        ),
        embedded=True,
    ),
    Scenario(
        "operate",
        (
            Run(
                "asyncq jobs examples.app:app",
                sample="schema-not-migrated",
                returncode=1,
                show=without(SETUP),
            ),
            Run("python examples/steering.py", sample="steering", show=from_line(" job  task")),
            Run("python examples/cancel.py", sample="cancel", stdout_only=True),
            Run(
                "asyncq requeue examples.steering:app 1",
                "requeue",
                prompt=True,
                returncode=1,
                show=without(SETUP),
            ),
            Run(
                "asyncq jobs examples.steering:app --status failed",
                "operate-cli",
                prompt=True,
                stdout_only=True,
            ),
            Run(
                "asyncq queues examples.steering:app", "operate-cli", prompt=True, stdout_only=True
            ),
            Run("asyncq stats examples.steering:app", "operate-cli", prompt=True, stdout_only=True),
            python(A_FEED),
            Run(
                "asyncq --log-format json worker examples.steering:app --drain",
                "json-logs",
                prompt=True,
                show=without(r'"logger": "asyncq\.(app|migrate)"'),
            ),
            hold_a_snapshot,
            Run("python examples/steering.py", stdout_only=True),  # rows for vacuum to keep
            sql("VACUUM asyncq_jobs"),
            until(
                "SELECT now() - xact_start > interval '1.5 s' FROM pg_stat_activity"
                " WHERE application_name = 'forgotten report'",
                "the snapshot to grow old",
            ),
            Run(
                "asyncq stats examples.steering:app --max-snapshot-age 1s",
                "stats-snapshot",
                prompt=True,
                show=only(r"^oldest snapshot:", r"^WARNING: vacuum is held back"),
            ),
        ),
    ),
    Scenario("results", (Run("python examples/results.py", "results", show=without(SETUP)),)),
    Scenario(
        "limits", (Run("python examples/limits.py", "limits", prompt=True, stdout_only=True),)
    ),
    Scenario(
        "schedules",
        (
            Run("python examples/periodic.py", "periodic", prompt=True, show=without(SETUP)),
            Run(
                "asyncq schedules examples.periodic:app", "schedules", prompt=True, stdout_only=True
            ),
        ),
    ),
    Scenario(
        "sync-tasks", (Run("python examples/sync_tasks.py", "sync-tasks", show=without(SETUP)),)
    ),
    Scenario(
        "tracing",
        (Run("python examples/tracing.py", "tracing", prompt=True, stdout_only=True, show=spans),),
    ),
    Scenario(
        "sqlalchemy",
        (Run("python examples/sqlalchemy_orders.py", "sqlalchemy-orders", show=without(SETUP)),),
    ),
    Scenario(
        "workflows",
        (
            Run("python examples/order_saga.py", sample="order-saga", show=without(SETUP)),
            Run(
                "asyncq job examples.order_saga:app 1",
                "saga-job",
                prompt=True,
                stdout_only=True,
                show=fields(
                    "id",
                    "task_name",
                    "queue",
                    "status",
                    "attempts",
                    "max_attempts",
                    "claims",
                    "args",
                    "result",
                    "steps",
                ),
            ),
            Run(
                "asyncq retry examples.order_saga:app 1 --from-step ship",
                "saga-retry",
                prompt=True,
                stdout_only=True,
            ),
            Run("python examples/fan_out.py", sample="fan-out", show=without(SETUP)),
            Run("python examples/batch_import.py", sample="batch-import", show=without(SETUP)),
            python(SCHEDULED_IMPORTS),
            Run(
                "asyncq job examples.batch_import:app 122",
                "batch-job",
                prompt=True,
                stdout_only=True,
                show=fields(
                    "id", "task_name", "queue", "status", "args", "result", "waiting_for", "after"
                ),
            ),
        ),
    ),
    Scenario(
        "bulk",
        (
            Run("asyncq migrate examples.steering:app"),
            # 1,200 jobs of a feed that failed for good, and one that is still queued.
            sql(
                "INSERT INTO asyncq_jobs (task_name, queue, args, status, attempts,"
                " last_error, finished_at) SELECT 'steering.parse_feed', 'steering',"
                " jsonb_build_object('url', 'https://example.com/feed-' || n || '.xml'),"
                " 'failed', 3, 'ConnectionError: feed unreachable', now()"
                " FROM generate_series(1, 1200) AS n"
            ),
            sql(
                "INSERT INTO asyncq_jobs (task_name, queue, args) VALUES"
                " ('steering.parse_feed', 'steering', '{\"url\": \"https://example.com/new.xml\"}')"
            ),
            as_user("ops"),
            Run(
                "asyncq bulk examples.steering:app requeue --task steering.parse_feed",
                "bulk-cli",
                prompt=True,
            ),
            Run(
                "asyncq bulk examples.steering:app requeue --task steering.parse_feed --yes",
                "bulk-cli",
                prompt=True,
            ),
            Run(
                "asyncq bulk examples.steering:app priority 10 --text feed-7 --yes",
                "bulk-cli",
                prompt=True,
            ),
            Run("asyncq audit examples.steering:app", "audit-cli", prompt=True),
        ),
    ),
    Scenario(
        "workflow-cli",
        (
            Run(f"asyncq migrate {HARNESS}"),
            harness("await flow.order.defer(order=1, items=3)"),
            # The order runs a step, spawns its children and gathers them; they wait.
            Run(f"asyncq worker {HARNESS} --drain"),
            harness("await flow.app.emit_event(flow.released(1))"),
            # The children end; the order runs a step more and waits for its event.
            Run(f"asyncq worker {HARNESS} --drain"),
            Run(
                f"asyncq job {HARNESS} 1",
                "workflow-job",
                prompt=True,
                stdout_only=True,
                show=fields(
                    "id",
                    "task_name",
                    "queue",
                    "status",
                    "run_at",
                    "args",
                    "result",
                    "waiting_for",
                    "steps",
                    "children",
                ),
            ),
            harness("await flow.app.emit_event(flow.shipped(1), 'shipped')"),
            Run(f"asyncq worker {HARNESS} --drain"),
            Run(
                f"asyncq retry {HARNESS} 1 --from-step pack",
                "workflow-retry",
                prompt=True,
                stdout_only=True,
            ),
            Run(f"asyncq worker {HARNESS} --drain"),
            Run(
                f"asyncq retry {HARNESS} 1 --from-step label",
                "workflow-retry",
                prompt=True,
                returncode=1,
                show=without(SETUP),
            ),
        ),
    ),
)


# -- running them ----------------------------------------------------------------------


def server_dsn(given: str | None) -> str:
    dsn = given or os.environ.get("ASYNCQ_TEST_DSN")
    if dsn:
        return dsn
    from asyncq import embedded

    return embedded.start()


def embedded_server() -> str | None:
    """The embedded PostgreSQL's DSN, or None without ``asyncq[embedded]``."""
    from asyncq import embedded
    from asyncq.errors import AsyncqError

    try:
        return embedded.start()
    except AsyncqError:
        return None


@contextlib.contextmanager
def database(server: str, *, create: bool = True) -> Iterator[tuple[str, str]]:
    """A new database on ``server`` (made now, or by the scenario), dropped afterwards:
    its DSN and its name."""
    name = f"asyncq_samples_{os.getpid()}_{secrets.token_hex(3)}"
    if create:
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield make_conninfo(server, dbname=name), name
    finally:
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def environment(dsn: str, ledger: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ASYNCQ_", "HARNESS_"))}
    env.update(
        ASYNCQ_DSN=dsn,
        HARNESS_LEDGER=str(ledger),
        PYTHONPATH=str(ROOT),
        PYTHONUNBUFFERED="1",  # the log lines and the prints in the order they were made
        TZ="UTC",
    )
    return env


def run(scenario: Scenario, server: str) -> dict[str, str]:
    """The samples ``scenario`` makes, by name."""
    with (
        database(server, create=not scenario.embedded) as (dsn, name),
        tempfile.TemporaryDirectory() as tmp,
        contextlib.ExitStack() as closing,
    ):
        env = environment(dsn, Path(tmp) / "ledger")
        if scenario.embedded:  # made by the App, as on a project's first run
            env.pop("ASYNCQ_DSN")
            env["ASYNCQ_EMBEDDED_DATABASE"] = name
        ctx = Context(dsn=dsn, env=env, closing=closing)
        for step in scenario.steps:
            step(ctx)
    made = {sample: "\n\n".join(parts) for sample, parts in ctx.outputs.items()}
    shown = {sample: text.replace(name, SHOWN_DATABASE) for sample, text in made.items()}
    if scenario.embedded:
        project = f"the project in {Path.home() / 'asyncq'}"
        shown = {
            sample: text.replace(SHOWN_DATABASE, "asyncq_asyncq").replace(
                "from ASYNCQ_EMBEDDED_DATABASE", project
            )
            for sample, text in shown.items()
        }
    return shown


MASKS = (
    (r"postgresql://\S+", "<dsn>"),
    (r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d(:\d\d([.,]\d+)?)?(Z|[+-]\d\d:?\d\d)?", "<time>"),
    (r"\b\d\d:\d\d\b", "<time>"),
    (r"\b[\w.-]+:\d+:[0-9a-f]{6}\b", "<worker>"),
    (r"\b0x[0-9a-f]+\b", "<hex>"),
    (r"\b\d+(\.\d+)?(e-?\d+)?(ms|s|us)\b", "<duration>"),
    (r'"duration": [\d.e-]+', '"duration": <duration>'),
    (r"\b\d+(\.\d+)? ?(B|kB|MB|GB)\b", "<size>"),
    (r"\b(pid|process) \[?\d+\]?", r"\1 <pid>"),
    (r"(PostgreSQL) \d+(\.\d+)*", r"\1 <version>"),
    (r"(/[\w.-]+)+", "<path>"),
)


# A log line of the worker's, which may fall before or after what the process prints.
LOG = re.compile(r"^(<time> )?(DEBUG|INFO|WARNING|ERROR|CRITICAL) ")


def normal(text: str, sample: Sample) -> list[str]:
    """``text`` as the comparison sees it (see the module's docstring): log lines are
    compared as a set, after the rest."""
    lines = []
    for line in text.strip().splitlines():
        if any(re.search(p, line) for p in sample.volatile):
            continue
        for pattern, mask in MASKS:
            line = re.sub(pattern, mask, line)
        if sample.numbers:
            line = re.sub(r"\d+(\.\d+)?", "<n>", line)
        lines.append(" ".join(line.split()))
    if sample.unordered:
        return sorted(lines)
    return [line for line in lines if not LOG.match(line)] + sorted(filter(LOG.match, lines))


def blocks(page: Path) -> list[tuple[str, str]]:
    """(sample name, text) of every marked block of ``page``."""
    return [(name, text.rstrip("\n")) for name, _, text in BLOCK.findall(page.read_text("utf-8"))]


def write(page: Path, made: dict[str, str]) -> list[str]:
    """Rewrite the marked blocks of ``page`` whose sample was made; the names rewritten."""
    changed: list[str] = []

    def replace(match: re.Match[str]) -> str:
        name, fence, text = match.groups()
        if name not in made or text.rstrip("\n") == made[name]:
            return match.group(0)
        changed.append(name)
        return f"<!-- sample: {name} -->\n{fence}\n{made[name]}\n```"

    text = page.read_text("utf-8")
    new = BLOCK.sub(replace, text)
    if new != text:
        page.write_text(new, "utf-8")
    return changed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.samples", description=__doc__)
    parser.add_argument("--write", action="store_true", help="rewrite the marked blocks")
    parser.add_argument("--dsn", help="the server (default: $ASYNCQ_TEST_DSN, else embedded)")
    parser.add_argument("--only", help="scenarios to run, by name, comma-separated")
    args = parser.parse_args(argv)

    marked: dict[str, list[tuple[Path, str]]] = {}
    for page in pages():
        for name, text in blocks(page):
            marked.setdefault(name, []).append((page, text))
    problems = [f"{name}: marked but made by no scenario" for name in marked if name not in SAMPLES]
    problems += [
        f"{name}: marked {len(found)} times" for name, found in marked.items() if len(found) > 1
    ]
    problems += [f"{name}: made but marked nowhere" for name in SAMPLES if name not in marked]
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 2

    chosen = args.only.split(",") if args.only else [s.name for s in SCENARIOS]
    unknown = set(chosen) - {s.name for s in SCENARIOS}
    if unknown:
        parser.error(f"no such scenario: {', '.join(sorted(unknown))}")
    server = server_dsn(args.dsn)
    made: dict[str, str] = {}
    for scenario in SCENARIOS:
        if scenario.name not in chosen:
            continue
        on = embedded_server() if scenario.embedded else server
        if on is None:
            print(f"{scenario.name}: skipped, no embedded PostgreSQL (asyncq[embedded])")
            continue
        started = time.monotonic()
        made.update(run(scenario, on))
        print(f"{scenario.name}: ran in {time.monotonic() - started:.1f}s", flush=True)

    if args.write:
        for page in pages():
            for name in write(page, made):
                print(f"{name}: rewritten in {page.relative_to(ROOT)}")
        return 0
    stale = 0
    for name, text in made.items():
        [(page, shown)] = marked[name]
        if normal(shown, SAMPLES[name]) != normal(text, SAMPLES[name]):
            stale += 1
            where = page.relative_to(ROOT)
            diff = difflib.unified_diff(
                shown.splitlines(), text.splitlines(), f"{where} ({name})", "a new run", lineterm=""
            )
            print("\n".join(diff), file=sys.stderr)
    if stale:
        print(
            f"{stale} sample(s) differ from a new run: rewrite them with"
            " `python -m tests.samples --write` (make samples) and read the diff",
            file=sys.stderr,
        )
        return 1
    print(f"{len(made)} samples match a new run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
