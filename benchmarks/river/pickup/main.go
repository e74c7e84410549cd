// Command river-pickup measures River's pickup: an idle client with one queue and a no-op
// worker; jobs inserted one at a time, each after the last one started, 10-20 ms apart
// (asyncq's latency part does the same). Both ends are read from Go's monotonic clock in
// this one process.
//
// Output, JSON lines on stdout: one line of settings, then one line per job after the
// warm-up: {"seq": i, "from_call_ms": ..., "from_commit_ms": ...}, where from_call_ms runs
// from just before client.Insert (asyncq's definition: from just before the enqueue call)
// and from_commit_ms from Insert's return (the insert committed) to the first line of Work.
//
// Built by benchmarks/river/build.sh beside River's CLI (the binary river-pickup).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

const queue = "pickup"

type pickupArgs struct {
	Seq int `json:"seq"`
}

func (pickupArgs) Kind() string { return "pickup" }

type started struct {
	seq int
	at  time.Time
}

type pickupWorker struct {
	river.WorkerDefaults[pickupArgs]
	started chan started
}

func (w *pickupWorker) Work(ctx context.Context, job *river.Job[pickupArgs]) error {
	w.started <- started{job.Args.Seq, time.Now()}
	return nil
}

func ms(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }

func main() {
	url := flag.String("database-url", "", "postgres:// URL of River's database")
	jobs := flag.Int("jobs", 200, "samples (after the warm-up)")
	warmup := flag.Int("warmup", 5, "jobs not counted at the start")
	cooldown := flag.Duration("fetch-cooldown", river.FetchCooldownDefault, "river.Config FetchCooldown")
	poll := flag.Duration("fetch-poll-interval", river.FetchPollIntervalDefault, "river.Config FetchPollInterval")
	gapMin := flag.Duration("gap-min", 10*time.Millisecond, "shortest pause before an insert")
	gapMax := flag.Duration("gap-max", 20*time.Millisecond, "longest pause before an insert")
	flag.Parse()
	if err := run(*url, *jobs, *warmup, *cooldown, *poll, *gapMin, *gapMax); err != nil {
		fmt.Fprintln(os.Stderr, "river-pickup:", err)
		os.Exit(1)
	}
}

func run(url string, jobs, warmup int, cooldown, poll, gapMin, gapMax time.Duration) error {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	driver := riverpgxv5.New(pool)
	migrator, err := rivermigrate.New(driver, nil)
	if err != nil {
		return err
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, "DELETE FROM river_job WHERE queue = $1", queue); err != nil {
		return err
	}

	worker := &pickupWorker{started: make(chan started, 16)}
	workers := river.NewWorkers()
	river.AddWorker(workers, worker)
	client, err := river.NewClient(driver, &river.Config{
		FetchCooldown:     cooldown,
		FetchPollInterval: poll,
		Logger:            slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		Queues:            map[string]river.QueueConfig{queue: {MaxWorkers: 10}},
		Workers:           workers,
	})
	if err != nil {
		return err
	}
	if err := client.Start(ctx); err != nil {
		return err
	}
	defer func() { _ = client.Stop(ctx) }()
	time.Sleep(time.Second) // connected, listening, idle

	out := json.NewEncoder(os.Stdout)
	_ = out.Encode(map[string]any{
		"settings":               true,
		"fetch_cooldown_ms":      ms(cooldown),
		"fetch_poll_interval_ms": ms(poll),
		"max_workers":            10,
		"jobs":                   jobs,
		"warmup":                 warmup,
	})
	for seq := 0; seq < warmup+jobs; seq++ {
		time.Sleep(gapMin + rand.N(gapMax-gapMin+1))
		called := time.Now()
		if _, err := client.Insert(ctx, pickupArgs{Seq: seq}, &river.InsertOpts{Queue: queue}); err != nil {
			return err
		}
		committed := time.Now()
		at, err := waitFor(worker.started, seq, 15*time.Second)
		if err != nil {
			return err
		}
		if seq >= warmup {
			_ = out.Encode(map[string]any{
				"seq":            seq,
				"from_call_ms":   ms(at.Sub(called)),
				"from_commit_ms": ms(at.Sub(committed)),
			})
		}
	}
	return nil
}

// waitFor returns when job seq started (a job retried after a lost completion may start twice).
func waitFor(ch <-chan started, seq int, within time.Duration) (time.Time, error) {
	deadline := time.After(within)
	for {
		select {
		case s := <-ch:
			if s.seq == seq {
				return s.at, nil
			}
		case <-deadline:
			return time.Time{}, fmt.Errorf("job %d did not start within %s", seq, within)
		}
	}
}
