package advantages

import (
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/internal/stagecmd"
)

// benchSegments is the number of segments BenchmarkAdvantages computes
// over: 1M, 20k under -short, or KILN_BENCH_ADV_SEGMENTS.
func benchSegments(b *testing.B) int {
	if s := os.Getenv("KILN_BENCH_ADV_SEGMENTS"); s != "" {
		n, err := strconv.Atoi(s)
		require.NoError(b, err, "KILN_BENCH_ADV_SEGMENTS")
		return n
	}
	if testing.Short() {
		return 20_000
	}
	return 1_000_000
}

// benchWorld writes n segments of n/10 rollouts in n/100 groups (1 to 19
// segments a rollout, 10 on average; 10 rollouts a group, half passing),
// each segment 48 tokens with a 24-token response region, in shards of
// 100k segments, and the rollouts' grades.
func benchWorld(b *testing.B, n int) (store.Store, dataset.Ref, dataset.Ref) {
	st, err := store.NewLocal(b.TempDir())
	require.NoError(b, err)
	ctx := context.Background()
	mk := func(name string, kind records.Kind) *dataset.Writer {
		w, err := dataset.NewWriter(ctx, st, dataset.Spec{Name: name, Kind: kind, Identity: dataset.Identity{Stage: "bench", Args: map[string]any{"n": n}}})
		require.NoError(b, err)
		return w
	}
	tw, gw := mk("trajectories", records.TrajectoriesKind()), mk("grades", records.GradesKind())
	const tokens, resp = 48, 24
	mask := make([]uint8, resp)
	lps := make([]float32, resp)
	for i := range mask {
		mask[i] = uint8(i % 2)
		lps[i] = -float32(i%7) / 8
	}
	var segs []records.Trajectory
	var grades []records.Grade
	flush := func() {
		if len(segs) == 0 {
			return
		}
		_, err := tw.WriteShard(ctx, int64(len(segs)), nil, func(out io.Writer) error {
			enc, err := records.NewTrajectoryEncoder(out, records.ArrowOptions{})
			if err != nil {
				return err
			}
			if err := enc.Write(segs...); err != nil {
				return err
			}
			return enc.Close()
		})
		require.NoError(b, err)
		segs = segs[:0]
	}
	written := 0
	for r := int64(0); written < n; r++ {
		group := r / 10
		pass := (r*7+group)%2 == 0
		g := records.Grade{RolloutID: r, Index: r, GroupIndex: group, Sample: r % 10, TaskID: fmt.Sprintf("task-%d", group), Applied: true, Failure: records.FailureTestsFailed}
		if pass {
			g.Reward, g.Failure = 1, records.FailureNone
		}
		grades = append(grades, g)
		for s := range min(1+int(r*7%19), n-written) {
			toks := make([]int32, tokens)
			for i := range toks {
				toks[i] = int32((int(r)*31 + s*17 + i*13) % 50_000)
			}
			segs = append(segs, records.Trajectory{RolloutID: r, Index: r, GroupIndex: group, Segment: int32(s),
				Tokens: toks, ResponseLength: resp, LossMask: mask, RolloutLogProbs: lps})
			written++
			if len(segs) == 100_000 {
				flush()
			}
		}
	}
	flush()
	_, err = gw.WriteShard(ctx, int64(len(grades)), nil, func(out io.Writer) error {
		enc := records.NewGradeEncoder(out)
		if err := enc.Write(grades...); err != nil {
			return err
		}
		return enc.Close()
	})
	require.NoError(b, err)
	tr, err := tw.Commit(ctx, nil)
	require.NoError(b, err)
	gr, err := gw.Commit(ctx, nil)
	require.NoError(b, err)
	return st, tr.Ref, gr.Ref
}

// plainRead is the floor the stage is measured against: the reading the
// stage cannot avoid, done the way the stage does it and nothing more.
// Every trajectories shard is read whole and checksummed and its columns
// the advantages rest on decoded (records.EachSegmentTotals), up to
// min(GOMAXPROCS, 4) shards at once, while the grades are read and decoded
// beside them: the stage's parallelism, so the ratio is not a two-core
// stage against a one-core read. Returns the segments read.
func plainRead(b *testing.B, st store.Store, tr, gr dataset.Ref) int {
	ctx := context.Background()
	tv, err := dataset.Open(ctx, st, tr)
	require.NoError(b, err)
	gv, err := dataset.Open(ctx, st, gr)
	require.NoError(b, err)
	done := make(chan error, 1)
	go func() {
		done <- gv.EachShard(ctx, func(_ int, data []byte) error {
			return records.EachGrade(data, func(records.Grade) error { return nil })
		})
	}()
	var rows atomic.Int64
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(min(runtime.GOMAXPROCS(0), 4))
	for i := range tv.Shards {
		g.Go(func() error {
			data, err := tv.ReadShard(gctx, i)
			if err != nil {
				return err
			}
			n := int64(0)
			err = records.EachSegmentTotals(data, func(records.SegmentTotals) error { n++; return nil })
			rows.Add(n)
			return err
		})
	}
	require.NoError(b, g.Wait())
	require.NoError(b, <-done)
	return int(rows.Load())
}

// benchRounds is how many alternating read/stage rounds one op runs: 5,
// or KILN_BENCH_ADV_ROUNDS.
func benchRounds(b *testing.B) int {
	if s := os.Getenv("KILN_BENCH_ADV_ROUNDS"); s != "" {
		n, err := strconv.Atoi(s)
		require.NoError(b, err, "KILN_BENCH_ADV_ROUNDS")
		return max(n, 1)
	}
	return 5
}

// BenchmarkAdvantages times kiln-advantages (read both inputs, check, join,
// GRPO, write and commit the advantages version) beside plainRead of the
// same two datasets, in one run, on the same cores: each op runs rounds of
// one read and one stage, the order swapped every round, so a neighbour's
// load spike hits both sides alike. The figure is the median of the
// per-round ratios stage/read (goal <= 1.5), with its spread (min, max);
// segments/s are of the fastest round of each side.
func BenchmarkAdvantages(b *testing.B) {
	n := benchSegments(b)
	rounds := benchRounds(b)
	st, tr, gr := benchWorld(b, n)
	env := &stagecmd.Env{Stdout: io.Discard, Stderr: io.Discard, Log: stagecmd.NewLogger(io.Discard, false)}
	plainRead(b, st, tr, gr) // warm the page cache for both
	var reads, stages []time.Duration
	read := func() {
		t0 := time.Now()
		require.Equal(b, n, plainRead(b, st, tr, gr))
		reads = append(reads, time.Since(t0))
	}
	stage := func(name string) {
		t0 := time.Now()
		o := RunOptions{Trajectories: tr.String(), Grades: gr.String(), Options: Options{Estimator: GRPO, StdEps: 1e-6, Infra: InfraExclude, MinGroupSize: 1}}
		res, err := Run(context.Background(), env, st, stagecmd.Output{Name: name}, o)
		require.NoError(b, err)
		stages = append(stages, time.Since(t0))
		require.Equal(b, int64(n), res.Version.Rows)
	}
	b.ResetTimer()
	for i := range b.N {
		for k := range rounds {
			name := fmt.Sprintf("advantages/%d-%d", i, k)
			if (i*rounds+k)%2 == 0 {
				read()
				stage(name)
			} else {
				stage(name)
				read()
			}
		}
	}
	b.StopTimer()
	ratios := make([]float64, len(reads))
	for i := range reads {
		ratios[i] = stages[i].Seconds() / reads[i].Seconds()
	}
	slices.Sort(ratios)
	b.ReportMetric(float64(n)/slices.Min(reads).Seconds(), "read_segments/s")
	b.ReportMetric(float64(n)/slices.Min(stages).Seconds(), "stage_segments/s")
	b.ReportMetric(ratios[len(ratios)/2], "stage/read")
	b.ReportMetric(ratios[0], "min_stage/read")
	b.ReportMetric(ratios[len(ratios)-1], "max_stage/read")
}
