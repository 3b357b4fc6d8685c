package advantages

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/parquet-go/parquet-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/internal/stagecmd"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// world is a store with a chain tasks -> rollouts -> trajectories and
// grades, built through the records and dataset APIs (there is no rollout
// stage yet): per task, samples whose patch fixes the bug (reward 1) and
// samples whose patch does not, each split into 1-3 segments.
type world struct {
	st             store.Store
	env            *stagecmd.Env
	stdout, stderr *bytes.Buffer
	tasks          dataset.Ref
	rollouts       dataset.Ref
	trajectories   dataset.Ref
	grades         dataset.Ref
	fixing         map[int64]bool
}

func commitRows(t *testing.T, st store.Store, name string, kind records.Kind, inputs []dataset.Ref, rows int, encode func(io.Writer) error) dataset.Ref {
	t.Helper()
	ctx := context.Background()
	w, err := dataset.NewWriter(ctx, st, dataset.Spec{Name: name, Kind: kind, Identity: dataset.Identity{Stage: "test", Inputs: inputs,
		Args: map[string]any{"t": t.Name(), "at": time.Now().UnixNano()}}})
	require.NoError(t, err)
	_, err = w.WriteShard(ctx, int64(rows), nil, encode)
	require.NoError(t, err)
	res, err := w.Commit(ctx, nil)
	require.NoError(t, err)
	return res.Ref
}

func commitTasks(t *testing.T, st store.Store, name string, ids ...string) dataset.Ref {
	var tasks []records.Task
	for i, id := range ids {
		tasks = append(tasks, records.Task{TaskID: id, TaskIndex: int64(i), Prompt: `"fix it"`, Metadata: "{}"})
	}
	return commitRows(t, st, name, records.TasksKind(), nil, len(tasks), func(out io.Writer) error {
		enc := records.NewTaskEncoder(out)
		if err := enc.Write(tasks...); err != nil {
			return err
		}
		return enc.Close()
	})
}

func commitGrades(t *testing.T, st store.Store, inputs []dataset.Ref, grades []records.Grade) dataset.Ref {
	return commitRows(t, st, "grades", records.GradesKind(), inputs, len(grades), func(out io.Writer) error {
		enc := records.NewGradeEncoder(out)
		if err := enc.Write(grades...); err != nil {
			return err
		}
		return enc.Close()
	})
}

func commitSegments(t *testing.T, st store.Store, inputs []dataset.Ref, segs []records.Trajectory) dataset.Ref {
	return commitRows(t, st, "trajectories", records.TrajectoriesKind(), inputs, len(segs), func(out io.Writer) error {
		enc, err := records.NewTrajectoryEncoder(out, records.ArrowOptions{})
		if err != nil {
			return err
		}
		if err := enc.Write(segs...); err != nil {
			return err
		}
		return enc.Close()
	})
}

func segment(rollout, group int64, seg int32, trained int) records.Trajectory {
	n := trained + 1
	mask := make([]uint8, n)
	for i := 1; i < n; i++ {
		mask[i] = 1
	}
	return records.Trajectory{RolloutID: rollout, Index: rollout, GroupIndex: group, Segment: seg,
		Tokens: make([]int32, n+2), ResponseLength: int32(n), LossMask: mask, RolloutLogProbs: make([]float32, n)}
}

func grade(rollout, group int64, task string, sample int64, pass bool) records.Grade {
	g := records.Grade{RolloutID: rollout, Index: rollout, GroupIndex: group, Sample: sample, TaskID: task, Applied: true, Failure: records.FailureTestsFailed}
	if pass {
		g.Reward, g.Failure = 1, records.FailureNone
	}
	return g
}

// newWorld: two fixture tasks, four samples each; task 0's samples 0 and 2
// fix the bug, task 1's sample 1 does. Rollout r has r%3+1 segments.
func newWorld(t *testing.T) *world {
	st, err := store.NewLocal(t.TempDir())
	require.NoError(t, err)
	w := &world{st: st, stdout: &bytes.Buffer{}, stderr: &bytes.Buffer{}, fixing: map[int64]bool{0: true, 2: true, 5: true}}
	w.env = &stagecmd.Env{Stdout: w.stdout, Stderr: w.stderr, Log: stagecmd.NewLogger(w.stderr, false)}
	ids := []string{"fixture-duration-001", "fixture-slugify-002"}
	w.tasks = commitTasks(t, st, "tasks", ids...)
	var rollouts []records.Rollout
	var segs []records.Trajectory
	var grades []records.Grade
	for r := int64(0); r < 8; r++ {
		group := r / 4
		patch := "diff --git a/x b/x\n-broken\n+still broken\n"
		if w.fixing[r] {
			patch = "diff --git a/x b/x\n-broken\n+fixed\n"
		}
		rollouts = append(rollouts, records.Rollout{RolloutID: r, Index: r, GroupIndex: group, Sample: r % 4, TaskID: ids[group], Agent: "shell", WeightsVersion: "w0", Patch: patch})
		for s := int32(0); s <= int32(r%3); s++ {
			segs = append(segs, segment(r, group, s, int(s)+1))
		}
		grades = append(grades, grade(r, group, ids[group], r%4, w.fixing[r]))
	}
	w.rollouts = commitRows(t, st, "rollouts", records.RolloutsKind(), []dataset.Ref{w.tasks}, len(rollouts), func(out io.Writer) error {
		enc := records.NewRolloutEncoder(out)
		if err := enc.Write(rollouts...); err != nil {
			return err
		}
		return enc.Close()
	})
	w.trajectories = commitSegments(t, st, []dataset.Ref{w.rollouts}, segs)
	w.grades = commitGrades(t, st, []dataset.Ref{w.tasks, w.rollouts}, grades)
	return w
}

func (w *world) opts() RunOptions {
	return RunOptions{Trajectories: w.trajectories.String(), Grades: w.grades.String(),
		Options: Options{Estimator: GRPO, StdEps: 1e-6, Infra: InfraExclude, MinGroupSize: 2}}
}

func (w *world) run(o RunOptions) (dataset.Result, error) {
	w.stdout.Reset()
	return Run(context.Background(), w.env, w.st, stagecmd.Output{Name: "advantages"}, o)
}

func readAdvantages(t *testing.T, st store.Store, ref dataset.Ref) (*dataset.Version, []records.Advantage) {
	t.Helper()
	v, err := dataset.Open(context.Background(), st, ref)
	require.NoError(t, err)
	var rows []records.Advantage
	require.NoError(t, v.EachShard(context.Background(), func(_ int, data []byte) error {
		return records.EachAdvantage(data, func(a *records.Advantage) error { rows = append(rows, *a); return nil })
	}))
	return v, rows
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// End to end over datasets: fixing samples get positive advantages,
// non-fixing ones negative, on every segment; denominators; metrics; a
// rerun finds the version.
func TestRunEndToEnd(t *testing.T) {
	w := newWorld(t)
	res, err := w.run(w.opts())
	require.NoError(t, err)
	assert.Equal(t, res.Ref.String(), lastLine(w.stdout.String()), "the last stdout line is the committed reference")
	v, rows := readAdvantages(t, w.st, res.Ref)
	require.Len(t, rows, 1+2+3+1+2+3+1+2) // r%3+1 segments of r = 0..7
	assert.Equal(t, []dataset.Ref{w.trajectories, w.grades}, v.Inputs)
	trained := map[int64]int64{}
	for r := int64(0); r < 8; r++ {
		for s := int64(0); s <= r%3; s++ {
			trained[r] += s + 1
		}
	}
	for _, a := range rows {
		if w.fixing[a.RolloutID] {
			assert.Greater(t, a.Advantage, 0.0, "fixing rollout %d", a.RolloutID)
			assert.Equal(t, 1.0, a.Reward)
		} else {
			assert.Less(t, a.Advantage, 0.0, "non-fixing rollout %d", a.RolloutID)
		}
		assert.Equal(t, trained[a.RolloutID], a.RolloutTrainedTokens, "rollout %d", a.RolloutID)
	}
	// Task 0 is [1,0,1,0]: ±0.866024; task 1 is [0,1,0,0]: 1.499997 / −0.499999.
	adv := byRollout(rows)
	assert.InDelta(t, 0.866024, adv[0], 1e-6)
	assert.InDelta(t, -0.866024, adv[1], 1e-6)
	assert.InDelta(t, 1.499997, adv[5], 1e-6)
	assert.InDelta(t, -0.499999, adv[4], 1e-6)

	m, _ := json.Marshal(v.Metrics)
	for _, want := range []string{`"segments_in":15`, `"rollouts_in":8`, `"rows":15`, `"pass_at_1":0.375`, `"pass_at_k":{"1":0.375,"2":0.6666666666666666,"3":0.875,"4":1}`,
		`"segments_per_rollout":{"1":3,"2":3,"3":2}`, `"zero_advantage_groups_fraction":0`, `"dropped_rows":{}`, `"grades_without_trajectories":0`,
		`"group_stats":{"dropped":["",""],"gradeable":[4,4],"group_index":[0,1],"pass_rate":[0.5,0.25],"reward_mean":[0.5,0.25],"rollouts":[4,4],"segments":[7,8],"task_id":["fixture-duration-001","fixture-slugify-002"],"trained":[4,4],"zero_advantage":[false,false]}`} {
		assert.Contains(t, string(m), want)
	}

	again, err := w.run(w.opts())
	require.NoError(t, err)
	assert.Equal(t, res.Ref, again.Ref)
	assert.True(t, again.Existed)

	// Another estimator is another version.
	o := w.opts()
	o.Estimator = DrGRPO
	dr, err := w.run(o)
	require.NoError(t, err)
	assert.NotEqual(t, res.Ref, dr.Ref)
	_, rows = readAdvantages(t, w.st, dr.Ref)
	assert.InDelta(t, 0.5, byRollout(rows)[0], 1e-12)
}

// Bad input is an error naming the rollout (exit 5) and commits nothing;
// a grade without trajectories is a counted drop.
func TestRunBadInput(t *testing.T) {
	cases := []struct {
		name  string
		edit  func(t *testing.T, w *world) RunOptions
		err   string
		code  int
		count string // instead of an error: a metric that must be present
	}{
		{name: "rollout without a grade", err: "rollout 7 (group 1) has segments but no grade", code: stagecmd.ExitBadInput,
			edit: func(t *testing.T, w *world) RunOptions {
				var gs []records.Grade
				for r := int64(0); r < 7; r++ {
					gs = append(gs, grade(r, r/4, []string{"fixture-duration-001", "fixture-slugify-002"}[r/4], r%4, w.fixing[r]))
				}
				o := w.opts()
				o.Grades = commitGrades(t, w.st, []dataset.Ref{w.tasks, w.rollouts}, gs).String()
				return o
			}},
		{name: "grade without trajectories", count: `"grades_without_trajectories":1`,
			edit: func(t *testing.T, w *world) RunOptions {
				var segs []records.Trajectory
				for r := int64(0); r < 7; r++ {
					for s := int32(0); s <= int32(r%3); s++ {
						segs = append(segs, segment(r, r/4, s, int(s)+1))
					}
				}
				o := w.opts()
				o.Trajectories = commitSegments(t, w.st, []dataset.Ref{w.rollouts}, segs).String()
				return o
			}},
		{name: "disagreeing segments", err: "rollout 2: segment 1 has group_index 1", code: stagecmd.ExitBadInput,
			edit: func(t *testing.T, w *world) RunOptions {
				segs := []records.Trajectory{segment(2, 0, 0, 1), segment(2, 1, 1, 1)}
				o := w.opts()
				o.Trajectories = commitSegments(t, w.st, []dataset.Ref{w.rollouts}, segs).String()
				return o
			}},
		{name: "NaN reward", err: "grade of rollout 3 (task \"fixture-duration-001\"): reward NaN, want a number in [0, 1]", code: stagecmd.ExitBadInput,
			edit: func(t *testing.T, w *world) RunOptions {
				o := w.opts()
				o.Grades = commitRawGrades(t, w, func(g *records.Grade) {
					if g.RolloutID == 3 {
						g.Reward = math.NaN()
					}
				}).String()
				return o
			}},
		{name: "out-of-range reward", err: "grade of rollout 4 (task \"fixture-slugify-002\"): reward 1.5, want a number in [0, 1]", code: stagecmd.ExitBadInput,
			edit: func(t *testing.T, w *world) RunOptions {
				o := w.opts()
				o.Grades = commitRawGrades(t, w, func(g *records.Grade) {
					if g.RolloutID == 4 {
						g.Reward = 1.5
					}
				}).String()
				return o
			}},
		{name: "grades of another tasks version", err: "were graded against tasks", code: stagecmd.ExitBadInput,
			edit: func(t *testing.T, w *world) RunOptions {
				other := commitTasks(t, w.st, "tasks", "fixture-duration-001", "fixture-slugify-002")
				var gs []records.Grade
				for r := int64(0); r < 8; r++ {
					gs = append(gs, grade(r, r/4, []string{"fixture-duration-001", "fixture-slugify-002"}[r/4], r%4, w.fixing[r]))
				}
				o := w.opts()
				o.Grades = commitGrades(t, w.st, []dataset.Ref{other}, gs).String()
				return o
			}},
		{name: "grades that are not grades", err: "holds trajectories records, not grades", code: stagecmd.ExitUsage,
			edit: func(t *testing.T, w *world) RunOptions { o := w.opts(); o.Grades = w.trajectories.String(); return o }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := newWorld(t)
			res, err := w.run(c.edit(t, w))
			if c.count != "" {
				require.NoError(t, err)
				v, _ := readAdvantages(t, w.st, res.Ref)
				m, _ := json.Marshal(v.Metrics)
				assert.Contains(t, string(m), c.count)
				return
			}
			require.Error(t, err)
			assert.ErrorContains(t, err, c.err)
			assert.Equal(t, c.code, stagecmd.ExitCode(err))
			_, err = dataset.Resolve(context.Background(), w.st, "advantages")
			assert.ErrorIs(t, err, dataset.ErrNotFound, "nothing committed")
		})
	}
}

// commitRawGrades writes the world's grades, edited, with parquet-go
// directly: the grades encoder refuses invalid rows, and the point is a
// reader that does not trust its input.
func commitRawGrades(t *testing.T, w *world, edit func(*records.Grade)) dataset.Ref {
	var gs []records.Grade
	for r := int64(0); r < 8; r++ {
		g := grade(r, r/4, []string{"fixture-duration-001", "fixture-slugify-002"}[r/4], r%4, w.fixing[r])
		edit(&g)
		gs = append(gs, g)
	}
	return commitRows(t, w.st, "grades", records.GradesKind(), []dataset.Ref{w.tasks, w.rollouts}, len(gs), func(out io.Writer) error {
		pw := parquet.NewGenericWriter[records.Grade](out)
		if _, err := pw.Write(gs); err != nil {
			return err
		}
		return pw.Close()
	})
}

func TestRunUsage(t *testing.T) {
	w := newWorld(t)
	for _, edit := range []func(*RunOptions){
		func(o *RunOptions) { o.Estimator = "ppo" },
		func(o *RunOptions) { o.Infra = "ignore" },
		func(o *RunOptions) { o.StdEps = 0 },
		func(o *RunOptions) { o.MinGroupSize = 0 },
	} {
		o := w.opts()
		edit(&o)
		_, err := w.run(o)
		assert.Equal(t, stagecmd.ExitUsage, stagecmd.ExitCode(err), "%v", err)
	}
}

// select keeps the tasks with both outcomes among enough gradeable
// samples, as a tasks dataset with lineage and the criterion.
func TestSelect(t *testing.T) {
	st, err := store.NewLocal(t.TempDir())
	require.NoError(t, err)
	ids := []string{"mixed", "all-fail", "all-pass", "few", "infra-heavy", "ungraded"}
	tasks := commitTasks(t, st, "tasks", ids...)
	var gs []records.Grade
	id := int64(0)
	add := func(group int64, pass bool, failure string) {
		g := grade(id, group, ids[group], id, pass)
		if failure != "" {
			g.Failure = failure
		}
		gs = append(gs, g)
		id++
	}
	for i := range 8 {
		add(0, i%3 == 0, "")
		add(1, false, "")
		add(2, true, "")
	}
	for i := range 3 {
		add(3, i == 0, "")
	}
	for i := range 8 {
		if i < 6 {
			add(4, false, records.FailureInfraError)
		} else {
			add(4, i == 6, "")
		}
	}
	grades := commitGrades(t, st, []dataset.Ref{tasks}, gs)
	var stdout, stderr bytes.Buffer
	env := &stagecmd.Env{Stdout: &stdout, Stderr: &stderr, Log: stagecmd.NewLogger(&stderr, false)}
	res, err := Select(context.Background(), env, st, stagecmd.Output{Name: "tasks/learnable"}, grades.String(), tasks.String(), 8)
	require.NoError(t, err)
	assert.Equal(t, res.Ref.String(), lastLine(stdout.String()))
	v, err := dataset.Open(context.Background(), st, res.Ref)
	require.NoError(t, err)
	assert.Equal(t, "tasks", v.Kind().Name)
	assert.Equal(t, []dataset.Ref{grades, tasks}, v.Inputs)
	var got []records.Task
	require.NoError(t, v.EachShard(context.Background(), func(_ int, data []byte) error {
		return records.EachTask(data, func(t records.Task) error { got = append(got, t); return nil })
	}))
	require.Len(t, got, 1)
	assert.Equal(t, "mixed", got[0].TaskID)
	assert.Equal(t, int64(0), got[0].TaskIndex)
	m, _ := json.Marshal(v.Metrics)
	assert.Contains(t, string(m), `"tasks":{"all_fail":1,"all_pass":1,"selected":1,"too_few_samples":2,"ungraded":1}`)
	assert.Contains(t, string(m), `"min_samples":8`)

	// Grades of another tasks version are refused.
	other := commitTasks(t, st, "tasks", ids...)
	_, err = Select(context.Background(), env, st, stagecmd.Output{Name: "tasks/learnable2"}, grades.String(), other.String(), 8)
	assert.ErrorContains(t, err, "were graded against tasks "+tasks.String()+", not "+other.String())
	assert.Equal(t, stagecmd.ExitBadInput, stagecmd.ExitCode(err))
}

// --min-samples at its edge: 1 is refused, 2 (one success and one
// failure) is the least accepted and judges a two-sample task; baseline
// grades are not samples and are counted in baseline_grades_ignored
// (mutation survivors: minSamples <= 2, and len(grades) + len(nonBaseline)).
func TestSelectMinSamplesAndBaseline(t *testing.T) {
	st, err := store.NewLocal(t.TempDir())
	require.NoError(t, err)
	ids := []string{"pair", "single", "triple"}
	tasks := commitTasks(t, st, "tasks", ids...)
	var gs []records.Grade
	id := int64(0)
	add := func(group int64, pass, baseline bool) {
		g := grade(id, group, ids[group], id, pass)
		g.Baseline = baseline
		gs = append(gs, g)
		id++
	}
	add(0, true, false)
	add(0, false, false)
	add(1, false, false)
	add(2, true, false)
	add(2, false, false)
	add(2, false, false)
	// One baseline per task; single's passes, which would make it mixed
	// with two samples if baseline grades counted.
	add(0, false, true)
	add(1, true, true)
	add(2, false, true)
	grades := commitGrades(t, st, []dataset.Ref{tasks}, gs)
	for _, tc := range []struct {
		minSamples int
		usage      bool
		selected   []string
		counts     map[string]any
	}{
		{minSamples: 1, usage: true},
		{minSamples: 2, selected: []string{"pair", "triple"}, counts: map[string]any{"selected": 2.0, "too_few_samples": 1.0}},
		{minSamples: 3, selected: []string{"triple"}, counts: map[string]any{"selected": 1.0, "too_few_samples": 2.0}},
		{minSamples: 4, counts: map[string]any{"too_few_samples": 3.0}},
	} {
		var stdout, stderr bytes.Buffer
		env := &stagecmd.Env{Stdout: &stdout, Stderr: &stderr, Log: stagecmd.NewLogger(&stderr, false)}
		res, err := Select(context.Background(), env, st, stagecmd.Output{Name: "tasks/learnable"}, grades.String(), tasks.String(), tc.minSamples)
		if tc.usage {
			assert.ErrorContains(t, err, "want at least 2", "min-samples %d", tc.minSamples)
			assert.Equal(t, stagecmd.ExitUsage, stagecmd.ExitCode(err), "min-samples %d", tc.minSamples)
			continue
		}
		require.NoError(t, err, "min-samples %d", tc.minSamples)
		v, err := dataset.Open(context.Background(), st, res.Ref)
		require.NoError(t, err)
		var got []string
		require.NoError(t, v.EachShard(context.Background(), func(_ int, data []byte) error {
			return records.EachTask(data, func(t records.Task) error { got = append(got, t.TaskID); return nil })
		}))
		assert.Equal(t, tc.selected, got, "min-samples %d", tc.minSamples)
		raw, err := json.Marshal(v.Metrics)
		require.NoError(t, err)
		var m map[string]any
		require.NoError(t, json.Unmarshal(raw, &m))
		assert.Equal(t, tc.counts, m["tasks"], "min-samples %d", tc.minSamples)
		assert.Equal(t, 3.0, m["tasks_in"], "min-samples %d", tc.minSamples)
		assert.Equal(t, 3.0, m["baseline_grades_ignored"], "min-samples %d", tc.minSamples)
	}
}

// stats prints the summary; the golden file is the output.
func TestStatsGolden(t *testing.T) {
	w := newWorld(t)
	var out bytes.Buffer
	require.NoError(t, Stats(context.Background(), &out, w.st, w.grades.String()))
	got := strings.Replace(out.String(), w.grades.String(), "grades@VERSION", 1)
	path := filepath.Join("testdata", "stats.golden")
	if *update {
		require.NoError(t, os.MkdirAll("testdata", 0o755))
		require.NoError(t, os.WriteFile(path, []byte(got), 0o644))
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "run go test -update to write %s", path)
	assert.Equal(t, string(want), got)
}

// Shards are decoded in parallel but read back in the version's order, and
// a rollout split across shards is still one rollout.
func TestReadSegmentsShardOrder(t *testing.T) {
	st, err := store.NewLocal(t.TempDir())
	require.NoError(t, err)
	ctx := context.Background()
	w, err := dataset.NewWriter(ctx, st, dataset.Spec{Name: "trajectories", Kind: records.TrajectoriesKind(), Identity: dataset.Identity{Stage: "test"}})
	require.NoError(t, err)
	var want []Segment
	for sh := range 7 {
		var segs []records.Trajectory
		for k := range 5 {
			r := int64(sh*5+k) / 3 // rollouts straddle shards
			segs = append(segs, segment(r, r/4, int32((sh*5+k)%3), k+1))
			want = append(want, Segment{RolloutID: r, Index: r, GroupIndex: r / 4, Segment: int32((sh*5 + k) % 3), Trained: int64(k + 1)})
		}
		_, err := w.WriteShard(ctx, int64(len(segs)), nil, func(out io.Writer) error {
			enc, err := records.NewTrajectoryEncoder(out, records.ArrowOptions{})
			if err != nil {
				return err
			}
			if err := enc.Write(segs...); err != nil {
				return err
			}
			return enc.Close()
		})
		require.NoError(t, err)
	}
	res, err := w.Commit(ctx, nil)
	require.NoError(t, err)
	v, err := dataset.Open(ctx, st, res.Ref)
	require.NoError(t, err)
	got, err := ReadSegments(ctx, v)
	require.NoError(t, err)
	assert.Equal(t, want, got)
}
