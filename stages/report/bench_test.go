package report_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/stages/report"
	"github.com/kilnrl/kiln/stages/report/reporttest"
)

// BenchmarkReport times kiln report (Gather of the steps given as their
// checkpoints' refs, then the page and its rollout files) against reading
// the same datasets as kiln export does (every row of every step's
// rollouts, turns, trajectories, grades, advantages and checkpoints, as
// JSON lines to a discarding buffer: the unavoidable work of looking at
// them), alternating in rounds on the same cores. Figures: the median
// per-round ratio report/read with its spread (goal <= 2), the page's
// size (goal <= 10 MB) and the files beside it (one per step). The load
// average before and after is logged: the figure depends on it (report
// renders on every core, the read uses one). A synthetic run of 100
// steps × 64 rollouts × 20 turns (reporttest), 5 rounds; -short: 4 × 16
// × 4, one round.
//
//	go test ./stages/report -run '^$' -bench BenchmarkReport -benchtime 1x
func BenchmarkReport(b *testing.B) {
	o := reporttest.Options{Steps: 100, Tasks: 16, Samples: 4, Turns: 20}
	rounds := 5
	if testing.Short() {
		o = reporttest.Options{Steps: 4, Tasks: 4, Samples: 4, Turns: 4}
		rounds = 1
	}
	ctx := context.Background()
	st, err := store.Open(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	t0 := time.Now()
	run := reporttest.Write(b, st, o)
	b.Logf("wrote %d steps × %d rollouts × %d turns in %v", o.Steps, o.Tasks*o.Samples, o.Turns, time.Since(t0).Round(time.Second))
	var refs []string
	var all []dataset.Ref
	for _, s := range run.Steps {
		refs = append(refs, s.Checkpoints.String())
		all = append(all, s.Rollouts, s.Turns, s.Trajectories, s.Grades, s.Advantages, s.Checkpoints)
	}
	out := filepath.Join(b.TempDir(), "report.html")
	read := func() {
		w := bufio.NewWriterSize(io.Discard, 1<<20)
		for _, ref := range all {
			v, err := dataset.Open(ctx, st, ref)
			if err != nil {
				b.Fatal(err)
			}
			if err := v.EachJSON(ctx, func(row json.RawMessage) error {
				_, err := fmt.Fprintf(w, "%s\n", row)
				return err
			}); err != nil {
				b.Fatal(err)
			}
		}
		w.Flush()
	}
	write := func() {
		r, err := report.Gather(ctx, report.Options{Store: st, Refs: refs})
		if err != nil {
			b.Fatal(err)
		}
		if err := report.WriteHTML(ctx, st, r, report.HTMLOptions{Out: out}); err != nil {
			b.Fatal(err)
		}
	}
	loadavg := func() string {
		l, _ := os.ReadFile("/proc/loadavg")
		return strings.TrimSpace(string(l))
	}
	b.Logf("load average before: %s (%d cores)", loadavg(), runtime.NumCPU())
	b.ResetTimer()
	var ratios []float64
	for range b.N {
		for range rounds {
			t := time.Now()
			read()
			tr := time.Since(t)
			t = time.Now()
			write()
			tw := time.Since(t)
			ratios = append(ratios, tw.Seconds()/tr.Seconds())
			b.Logf("round: read %v, report %v", tr.Round(time.Millisecond), tw.Round(time.Millisecond))
		}
	}
	b.StopTimer()
	b.Logf("load average after: %s", loadavg())
	slices.Sort(ratios)
	fi, err := os.Stat(out)
	if err != nil {
		b.Fatal(err)
	}
	var files, filesBytes int64
	filepath.Walk(report.FilesDir(out), func(_ string, info os.FileInfo, err error) error {
		if err == nil && !info.IsDir() {
			files++
			filesBytes += info.Size()
		}
		return nil
	})
	b.ReportMetric(ratios[len(ratios)/2], "report/read")
	b.ReportMetric(ratios[0], "min_report/read")
	b.ReportMetric(ratios[len(ratios)-1], "max_report/read")
	b.ReportMetric(float64(fi.Size())/1e6, "page_MB")
	b.ReportMetric(float64(files), "files")
	b.ReportMetric(float64(filesBytes)/1e6, "files_MB")
}
