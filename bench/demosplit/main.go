// Command demosplit splits a finished demo run's wall time (make demo,
// pipelines/demo.kiln) by stage, from the pipeline's record and the
// datasets' rows and manifests, and prints the share spent outside the
// work kiln cannot avoid: the agents' runs (the engine's generation and
// the tools they call, in the rollout stages), the tasks' tests (the
// grading logs' test commands) and the trainer's optimizer steps (the
// train stages' step_metrics.time_s). The rest — process start-up, model
// loading, sandbox boots, patch applies, sync, commits — is counted as
// kiln's own.
//
//	go run ./bench/demosplit --store ~/.cache/kiln/demo/data
//
// BENCHMARKS.md's demo row is its output after make demo.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/pipelines"
)

func main() {
	storeURI := flag.String("store", os.Getenv("KILN_STORE"), "the demo's store (make demo: DEMO/data)")
	name := flag.String("pipeline", "demo", "the pipeline's PIPELINE name")
	flag.Parse()
	if err := run(context.Background(), *storeURI, *name); err != nil {
		fmt.Fprintln(os.Stderr, "demosplit:", err)
		os.Exit(1)
	}
}

// stage is a target's name without its step index.
func stage(target string) string { return strings.SplitN(target, "/", 2)[0] }

type row struct {
	wall, work time.Duration // work: the agents' runs or the optimizer steps inside wall
	targets    int
}

func run(ctx context.Context, uri, name string) error {
	if uri == "" {
		return fmt.Errorf("no --store (or KILN_STORE): pass the demo's store, DEMO/data")
	}
	st, err := store.Open(uri)
	if err != nil {
		return err
	}
	var entries []pipelines.Entry
	prefix := pipelines.RecordPrefix + name + "/targets/"
	if err := st.List(ctx, prefix, func(info store.Info) error {
		b, _, err := store.ReadAll(ctx, st, info.Key)
		if err != nil {
			return err
		}
		var e pipelines.Entry
		if err := json.Unmarshal(b, &e); err != nil {
			return fmt.Errorf("%s: %w", info.Key, err)
		}
		if !e.End.IsZero() && !strings.Contains(e.Attrs, "service") { // a service (an engine) runs beside the targets
			entries = append(entries, e)
		}
		return nil
	}); err != nil {
		return err
	}
	if len(entries) == 0 {
		return fmt.Errorf("no finished target of pipeline %q in %s: run make demo first", name, uri)
	}
	rows := map[string]*row{}
	var first, last time.Time
	for _, e := range entries {
		if first.IsZero() || e.Start.Before(first) {
			first = e.Start
		}
		if e.End.After(last) {
			last = e.End
		}
		r := rows[stage(e.Target)]
		if r == nil {
			r = &row{}
			rows[stage(e.Target)] = r
		}
		r.targets++
		r.wall += e.End.Sub(e.Start)
		var work time.Duration
		switch {
		case strings.Contains(e.Ref, "/trajectories@"): // kiln-rollout run: demos, rollout/k
			work, err = agentTime(ctx, st, strings.Replace(e.Ref, "/trajectories@", "/rollouts@", 1))
		case strings.Contains(e.Ref, "checkpoints/"):
			work, err = stepTime(ctx, st, e.Ref)
		case strings.Contains(e.Ref, "grades"):
			work, err = testTime(ctx, st, e.Ref)
		}
		if err != nil {
			return fmt.Errorf("%s (%s): %w", e.Target, e.Ref, err)
		}
		r.work += min(work, e.End.Sub(e.Start))
	}
	names := make([]string, 0, len(rows))
	var wall, work time.Duration
	for n, r := range rows {
		names = append(names, n)
		wall += r.wall
		work += r.work
	}
	sort.Slice(names, func(i, j int) bool { return rows[names[i]].wall > rows[names[j]].wall })
	tw := tabwriter.NewWriter(os.Stdout, 2, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "STAGE\tTARGETS\tWALL\tSHARE\tAGENTS/TESTS/STEPS\tKILN'S OWN\t")
	for _, n := range names {
		r := rows[n]
		fmt.Fprintf(tw, "%s\t%d\t%s\t%.1f%%\t%s\t%s\t\n", n, r.targets, r.wall.Round(100*time.Millisecond),
			100*float64(r.wall)/float64(wall), r.work.Round(100*time.Millisecond), (r.wall - r.work).Round(100*time.Millisecond))
	}
	fmt.Fprintf(tw, "all\t%d\t%s\t100%%\t%s\t%s\t\n", len(entries), wall.Round(100*time.Millisecond),
		work.Round(100*time.Millisecond), (wall - work).Round(100*time.Millisecond))
	if err := tw.Flush(); err != nil {
		return err
	}
	// Targets run one at a time (kiln run -j 1): what the walls do not
	// cover is kiln run's own, starting the engines (services) included.
	span := last.Sub(first)
	fmt.Printf("first start to last end: %s, %s of it between targets\n", span.Round(100*time.Millisecond), (span - wall).Round(100*time.Millisecond))
	fmt.Printf("kiln's own share (outside the agents' runs, the tests and the optimizer steps): %.1f%%\n", 100*float64(span-work)/float64(span))
	return nil
}

// agentTime is the time some agent of a kiln-rollout run was running:
// the union of its rollouts' [started_at, ended_at] (the runs overlap).
func agentTime(ctx context.Context, st store.Store, ref string) (time.Duration, error) {
	v, err := dataset.OpenString(ctx, st, ref)
	if err != nil {
		return 0, err
	}
	var spans []span
	if err := v.EachShard(ctx, func(_ int, data []byte) error {
		return records.EachRollout(data, func(r records.Rollout) error {
			spans = append(spans, span{r.StartedAt, r.EndedAt})
			return nil
		})
	}); err != nil {
		return 0, err
	}
	return covered(spans), nil
}

// isTest says whether a grading log's step runs a task's own tests (the
// others add the agent user, write and apply the patch).
func isTest(step string) bool {
	switch step {
	case "eval_cmd", "f2p", "swepro_run", "swepro_parser", "verifier":
		return true
	}
	return false
}

// testTime is the time some task's tests were running in a kiln-grade
// run: the union of its grading logs' test steps, [started,
// started + duration_ms]. Logs written before started was recorded
// count nothing.
func testTime(ctx context.Context, st store.Store, ref string) (time.Duration, error) {
	v, err := dataset.OpenString(ctx, st, ref)
	if err != nil {
		return 0, err
	}
	var keys []string
	if err := v.EachShard(ctx, func(_ int, data []byte) error {
		return records.EachGrade(data, func(g records.Grade) error {
			if g.Log != nil {
				keys = append(keys, *g.Log)
			}
			return nil
		})
	}); err != nil {
		return 0, err
	}
	var spans []span
	for _, k := range keys {
		b, _, err := store.ReadAll(ctx, st, k)
		if err != nil {
			return 0, err
		}
		if err := records.EachJSONLine(bytes.NewReader(b), func(n int, line []byte) error {
			var s struct {
				Step       string    `json:"step"`
				Started    time.Time `json:"started"`
				DurationMS float64   `json:"duration_ms"`
			}
			if err := json.Unmarshal(line, &s); err != nil {
				return fmt.Errorf("%s line %d: %w", k, n, err)
			}
			if isTest(s.Step) && !s.Started.IsZero() {
				spans = append(spans, span{s.Started, s.Started.Add(time.Duration(s.DurationMS * float64(time.Millisecond)))})
			}
			return nil
		}); err != nil {
			return 0, err
		}
	}
	return covered(spans), nil
}

type span struct{ a, b time.Time }

// covered is the length of the union of spans: time covered by one or
// more of them, overlaps counted once.
func covered(spans []span) time.Duration {
	sort.Slice(spans, func(i, j int) bool { return spans[i].a.Before(spans[j].a) })
	var total time.Duration
	var cur span
	for i, s := range spans {
		switch {
		case i == 0:
			cur = s
		case s.a.After(cur.b):
			total += cur.b.Sub(cur.a)
			cur = s
		case s.b.After(cur.b):
			cur.b = s.b
		}
	}
	if len(spans) > 0 {
		total += cur.b.Sub(cur.a)
	}
	return total
}

// stepTime is the sum of a checkpoint's optimizer steps (step_metrics.time_s).
func stepTime(ctx context.Context, st store.Store, ref string) (time.Duration, error) {
	v, err := dataset.OpenString(ctx, st, ref)
	if err != nil {
		return 0, err
	}
	sm, _ := v.Metrics["step_metrics"].(map[string]any)
	ts, _ := sm["time_s"].([]any)
	var s float64
	for _, x := range ts {
		f, _ := x.(float64)
		s += f
	}
	return time.Duration(s * float64(time.Second)), nil
}
