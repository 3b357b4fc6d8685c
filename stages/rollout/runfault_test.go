package rollout

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/fixtures"
	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/internal/agent/enginetest"
	"github.com/kilnrl/kiln/internal/agent/harness"
	"github.com/kilnrl/kiln/internal/stagecmd"
	"github.com/kilnrl/kiln/internal/stagecmd/stagetest"
)

// TestRunFaults: each fault ends as rollouts rows with an abort reason (or,
// for an agent out of its budget, exit code -1) and no turns or segments
// for the aborted runs; nothing is dropped.
func TestRunFaults(t *testing.T) {
	w := newRunWorld(t)
	cases := []struct {
		name   string
		do     behaviour
		adjust func(*RunOptions)
		abort  string // "" = not aborted
		detail string // in an aborted row's abort_detail
		exit   int64
		turns  bool                                      // the run's turns are kept
		fault  func(enginetest.Request) enginetest.Fault // engine replies corrupted
		// engineGone: the engine's process goes away while every run is
		// in flight (startDyingEngine), instead of failing its replies.
		engineGone bool
	}{
		{name: "engine fails mid-run", do: failLater, abort: AbortEngineError, exit: 1,
			detail: `model calls failed with a server error (the first: 500 {"error":{"message":"vllm upstream 500: scripted engine failure"`},
		// Health checks are off: the runs end by their calls failing alone
		// (TestRunEngineUnhealthy has the health check's path).
		{name: "engine process goes away mid-run", do: lookAround, abort: AbortEngineError, exit: 1, engineGone: true,
			detail: "model calls failed with a server error (the first: 500 ",
			adjust: func(o *RunOptions) { o.HealthInterval = -1 }},
		{name: "engine returns bad logprobs", do: lookAround, abort: AbortEngineError, exit: 1,
			detail: "invalid reply from /inference/v1/generate (non-finite-logprob)",
			fault: func(r enginetest.Request) enginetest.Fault {
				if r.SessionID != "" && r.Turn >= 1 {
					return enginetest.FaultNaNLogprob
				}
				return enginetest.NoFault
			}},
		{name: "agent hangs past its budget", do: hang, exit: -1, turns: true,
			adjust: func(o *RunOptions) { o.Budget = 3 * time.Second }},
		// The bomb holds the sandbox at its pids limit after the agent
		// ends; Sandbox.Kill, which starts no process, empties it, so the
		// patch is still captured.
		{name: "agent fork-bombs", do: forkBomb, turns: true, exit: 0,
			adjust: func(o *RunOptions) { o.Budget, o.Sandbox.PidsMax = 5*time.Second, 64 }},
		{name: "whole-run deadline", do: hang, abort: AbortDeadline, exit: -1, detail: "the run passed its deadline of 4.000000001s: ",
			adjust: func(o *RunOptions) { o.Budget, o.SetupTimeout, o.Margin = 4*time.Second, time.Nanosecond, 0 }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			model := newScriptedModel(w.set, func(fixtures.Task, int) behaviour { return c.do })
			var url string
			if c.engineGone {
				url = startDyingEngine(t, model.script, len(w.set.Tasks))
			} else {
				srv := httptest.NewServer(enginetest.New(enginetest.Options{Script: model.script, MaxModelLen: 1 << 16, Fault: c.fault}))
				t.Cleanup(srv.Close)
				url = srv.URL
			}
			o := w.options(url)
			o.Samples = 1
			if c.adjust != nil {
				c.adjust(&o)
			}
			start := time.Now()
			res, err, logs := w.run(t, context.Background(), "rollout/"+strings.ReplaceAll(c.name, " ", "-"), o, nil)
			require.NoError(t, err, logs)
			assert.Less(t, time.Since(start), o.Budget+o.SetupTimeout+o.Margin+time.Minute)
			rows := readRollouts(t, w.st, res.Rollouts.Ref)
			require.Len(t, rows, len(w.set.Tasks), logs)
			turns := readTurns(t, w.st, res.Turns.Ref)
			segs := readSegments(t, w.st, res.Trajectories.Ref)
			for _, r := range rows {
				// The row says why it aborted, as the log does (docs/rollout.md §2.4).
				if r.AbortReason == nil {
					assert.Nil(t, r.AbortDetail, r.TaskID)
				} else {
					require.NotNil(t, r.AbortDetail, "%s: an aborted row without its detail", r.TaskID)
					assert.NotEmpty(t, *r.AbortDetail, r.TaskID)
					d := *r.AbortDetail
					assert.True(t, strings.Contains(logs, "detail="+strconv.Quote(d)) || strings.Contains(logs, "detail="+d+"\n"),
						"%s: the row's detail %q is the log's:\n%s", r.TaskID, d, logs)
				}
				assert.Equal(t, c.abort, deref(r.AbortReason), "%s: %s", r.TaskID, logs)
				assert.Equal(t, c.exit, r.AgentExitCode, r.TaskID)
				if c.abort != "" {
					assert.Contains(t, deref(r.AbortDetail), c.detail, r.TaskID)
				}
			}
			if c.turns {
				per := map[int64]int64{}
				for _, tr := range turns {
					per[tr.RolloutID]++
				}
				for _, r := range rows {
					if r.AbortReason != nil {
						assert.Zero(t, per[r.RolloutID], r.TaskID)
						continue
					}
					assert.Positive(t, r.Turns, r.TaskID)
					assert.Equal(t, r.Turns, per[r.RolloutID], r.TaskID)
				}
				assert.NotEmpty(t, segs)
			} else {
				assert.Empty(t, turns)
				assert.Empty(t, segs)
			}
		})
	}
}

// startDyingEngine serves script until n sessions have each made their
// second model call; those calls are held, and the engine goes away as a
// killed engine process does: its listener closes and every connection,
// the held calls' among them, is cut without a reply. Later calls find
// nothing listening.
func startDyingEngine(t *testing.T, script enginetest.Script, n int) string {
	t.Helper()
	held := make(chan struct{}, n)
	release := make(chan struct{})
	srv := httptest.NewServer(enginetest.New(enginetest.Options{MaxModelLen: 1 << 16, Script: func(r enginetest.Request) enginetest.Output {
		if r.SessionID == "" || r.Turn != 1 {
			return script(r)
		}
		held <- struct{}{}
		<-release
		return enginetest.Output{Err: errors.New("the engine is gone")} // never delivered
	}}))
	gone := make(chan struct{})
	go func() {
		defer close(gone)
		timeout := time.After(2 * time.Minute)
		for i := 0; i < n; i++ {
			select {
			case <-held:
			case <-timeout:
				t.Errorf("only %d of %d sessions made their second call; the engine goes away anyway", i, n)
				i = n
			}
		}
		srv.Listener.Close()
		srv.CloseClientConnections()
		close(release)
	}()
	t.Cleanup(func() {
		<-gone
		srv.Close()
	})
	return srv.URL
}

// bundleRootWith is a bundle root holding w's bundles (symlinks to
// them) but image's: mk makes that bundle's directory, or, when mk is nil,
// it is left out.
func bundleRootWith(t *testing.T, w *runWorld, image string, mk func(t *testing.T, dir string)) string {
	t.Helper()
	v, err := dataset.OpenString(context.Background(), w.st, w.images)
	require.NoError(t, err)
	var imgs []records.Image
	require.NoError(t, v.EachShard(context.Background(), func(_ int, data []byte) error {
		return records.EachImage(data, func(im records.Image) error { imgs = append(imgs, im); return nil })
	}))
	root := t.TempDir()
	found := false
	for _, im := range imgs {
		p := filepath.Join(root, filepath.FromSlash(im.Bundle))
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		if im.Image == image {
			found = true
			if mk != nil {
				require.NoError(t, os.Mkdir(p, 0o755))
				mk(t, p)
			}
			continue
		}
		require.NoError(t, os.Symlink(filepath.Join(w.bundles, filepath.FromSlash(im.Bundle)), p))
	}
	require.True(t, found, "image %q is not in %s", image, w.images)
	return root
}

// TestRunMissingBundle: a task whose bundle is not on this node aborts its
// runs as missing_image_or_workdir; the other tasks run.
func TestRunMissingBundle(t *testing.T) {
	w := newRunWorld(t)
	model := newScriptedModel(w.set, func(fixtures.Task, int) behaviour { return lookAround })
	o := w.options(startEngine(t, model.script))
	o.Bundles = bundleRootWith(t, w, w.set.Tasks[0].Image, nil)
	res, err, logs := w.run(t, context.Background(), "rollout/missing", o, nil)
	require.NoError(t, err, logs)
	rows := readRollouts(t, w.st, res.Rollouts.Ref)
	require.Len(t, rows, 2*len(w.set.Tasks))
	for _, r := range rows {
		if r.TaskID == w.set.Tasks[0].ID {
			assert.Equal(t, AbortMissingImage, deref(r.AbortReason))
			// The detail names the image and the path looked for.
			assert.Contains(t, deref(r.AbortDetail), fmt.Sprintf("the bundle of image %q is not on this node (%s%c", w.set.Tasks[0].Image,
				o.Bundles, filepath.Separator))
			assert.Zero(t, r.Turns)
		} else {
			assert.Nil(t, r.AbortReason, "%s: %v\n%s", r.TaskID, deref(r.AbortReason), logs)
			assert.Nil(t, r.AbortDetail, r.TaskID)
		}
	}
}

// TestRunSandboxCannotBoot: a task whose bundle is on this node but whose
// sandbox cannot boot (sandbox.Boot fails for real: bwrap refuses the
// rootfs, or the sandbox's init cannot create the agent user) aborts its
// runs as exception:sandbox_boot rows with no turns or segments
// (docs/rollout.md §2.4); the other tasks' runs complete, and the stage
// exits 0 with all three versions committed.
func TestRunSandboxCannotBoot(t *testing.T) {
	w := newRunWorld(t)
	broken := w.set.Tasks[0]
	imageOf := map[string]string{}
	for _, tk := range w.set.Tasks {
		imageOf[tk.ID] = tk.Image
	}
	cases := []struct {
		name string
		mk   func(t *testing.T, rootfs string)
		want string // in the abort's log line: why the boot failed
	}{
		// The sandbox's init creates the agent user in /etc/passwd.
		{"rootfs without /etc", func(t *testing.T, rootfs string) {}, "open /etc/passwd"},
		// bwrap mounts a tmpfs on /tmp, which is not a directory.
		{"rootfs with /tmp a file", func(t *testing.T, rootfs string) {
			require.NoError(t, os.WriteFile(filepath.Join(rootfs, "tmp"), []byte("not a directory\n"), 0o644))
		}, "Can't mkdir /tmp"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			model := newScriptedModel(w.set, func(fixtures.Task, int) behaviour { return lookAround })
			bundles := bundleRootWith(t, w, broken.Image, func(t *testing.T, dir string) {
				rootfs := filepath.Join(dir, "rootfs")
				require.NoError(t, os.Mkdir(rootfs, 0o755))
				c.mk(t, rootfs)
			})
			name := "rollout/noboot-" + strings.NewReplacer(" ", "-", "/", "").Replace(c.name)
			r := stagetest.Run(t, stageCommands, "run", "--store", w.storeDir, "--tasks", w.tasks, "--images", w.images,
				"--bundles", bundles, "--engine", startEngine(t, model.script), "--tokenizer-dir", w.tokenizer, "--mode", "generate",
				"--agent-binary", filepath.Join(w.tools, harness.ShellAgentName), "--samples", "2", "-j", "4",
				"--budget", "1m", "--weights-version", "w-test", "--out", name)
			require.Equal(t, 0, r.Code, r.Stderr)
			refs := strings.Fields(r.Stdout)
			require.Len(t, refs, 3, r.Stdout)
			for i, kind := range []string{"rollouts", "turns", "trajectories"} {
				assert.True(t, strings.HasPrefix(refs[i], name+"/"+kind+"@"), refs[i])
				v, err := dataset.OpenString(context.Background(), w.st, name+"/"+kind)
				require.NoError(t, err, "%s not committed", kind)
				assert.Equal(t, refs[i], v.Ref().String())
				require.NoError(t, dataset.Verify(context.Background(), v, nil))
			}
			var parsed [3]dataset.Ref
			for i := range refs {
				var err error
				parsed[i], err = dataset.ParseRef(refs[i])
				require.NoError(t, err)
			}
			rows := readRollouts(t, w.st, parsed[0])
			turns := readTurns(t, w.st, parsed[1])
			segs := readSegments(t, w.st, parsed[2])
			require.Len(t, rows, 2*len(w.set.Tasks), r.Stderr)
			perTurns, perSegs := map[int64]int{}, map[int64]int{}
			for _, tr := range turns {
				perTurns[tr.RolloutID]++
			}
			for _, s := range segs {
				perSegs[s.RolloutID]++
			}
			aborted := 0
			for _, row := range rows {
				if imageOf[row.TaskID] == broken.Image {
					aborted++
					assert.Equal(t, abortExceptionPref+"sandbox_boot", deref(row.AbortReason), row.TaskID)
					assert.Contains(t, deref(row.AbortDetail), c.want, "%s: the row says why the boot failed", row.TaskID)
					assert.EqualValues(t, -1, row.AgentExitCode, row.TaskID)
					assert.Zero(t, row.Turns, row.TaskID)
					assert.Zero(t, perTurns[row.RolloutID], "%s: turns of a run that never booted", row.TaskID)
					assert.Zero(t, perSegs[row.RolloutID], "%s: segments of a run that never booted", row.TaskID)
					assert.Nil(t, row.Artifacts, row.TaskID)
					continue
				}
				assert.Nil(t, row.AbortReason, "%s: %v\n%s", row.TaskID, deref(row.AbortReason), r.Stderr)
				assert.Nil(t, row.AbortDetail, row.TaskID)
				assert.EqualValues(t, 0, row.AgentExitCode, row.TaskID)
				assert.Positive(t, perTurns[row.RolloutID], row.TaskID)
				assert.Positive(t, perSegs[row.RolloutID], row.TaskID)
			}
			assert.Positive(t, aborted)
			assert.Contains(t, r.Stderr, "exception:sandbox_boot")
			assert.Contains(t, r.Stderr, c.want)
		})
	}
}

// TestRunEngineDownAtStart: an engine that does not answer its probe stops
// the stage before any run, with an error naming it; nothing is committed.
func TestRunEngineDownAtStart(t *testing.T) {
	w := newRunWorld(t)
	up := startEngine(t, newScriptedModel(w.set, func(fixtures.Task, int) behaviour { return lookAround }).script)
	down := "http://127.0.0.1:1"
	r := stagetest.Run(t, stageCommands, "run", "--store", w.storeDir, "--tasks", w.tasks, "--images", w.images,
		"--bundles", w.bundles, "--engine", up+","+down, "--tokenizer-dir", w.tokenizer, "--mode", "generate",
		"--agent-binary", filepath.Join(w.tools, "kiln-agent"), "--out", "rollout/down")
	assert.Equal(t, 1, r.Code, r.Stderr)
	assert.Contains(t, r.Stderr, "engine probe failed")
	assert.Contains(t, r.Stderr, down)
	for _, name := range []string{"rollout/down/rollouts", "rollout/down/turns", "rollout/down/trajectories"} {
		_, err := dataset.OpenString(context.Background(), w.st, name)
		assert.Error(t, err, name)
	}
}

// TestRunResume: a stage stopped after two committed batches (as SIGTERM
// stops it) leaves them receipted; the rerun runs only the others and
// commits the version --print-version names, with every run once in all
// three datasets.
func TestRunResume(t *testing.T) {
	w := newRunWorld(t)
	model := newScriptedModel(w.set, func(_ fixtures.Task, nth int) behaviour {
		if nth == 0 {
			return fixIt
		}
		return lookAround
	})
	o := w.options(startEngine(t, model.script))
	o.Jobs, o.FlushRuns = 1, 1
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	receipts := 0
	hook := func(point string) {
		// Each batch receipts its turns, trajectories and rollouts shards.
		if point == dataset.HookRowsReceipted {
			if receipts++; receipts == 6 {
				cancel()
			}
		}
	}
	_, err, logs := w.run(t, ctx, "rollout/resume", o, hook)
	require.ErrorIs(t, err, context.Canceled, logs)

	var printed strings.Builder
	env := w.env(&printed)
	_, err = Run(context.Background(), env, w.st, RunOutput{Name: "rollout/resume", PrintVersion: true}, o)
	require.NoError(t, err)
	want := strings.Fields(printed.String())
	require.Len(t, want, 3)

	res, err, logs := w.run(t, context.Background(), "rollout/resume", o, nil)
	require.NoError(t, err, logs)
	assert.Equal(t, want, []string{res.Rollouts.Ref.String(), res.Turns.Ref.String(), res.Trajectories.Ref.String()})
	assert.Contains(t, logs, "2 resumed from an earlier attempt")
	rows := readRollouts(t, w.st, res.Rollouts.Ref)
	require.Len(t, rows, 2*len(w.set.Tasks))
	seen := map[int64]bool{}
	for _, r := range rows {
		assert.False(t, seen[r.Index], "rollout %d twice", r.Index)
		seen[r.Index] = true
		assert.Nil(t, r.AbortReason)
	}
	sessions := map[int64]string{}
	for _, tr := range readTurns(t, w.st, res.Turns.Ref) {
		if s, ok := sessions[tr.RolloutID]; ok {
			assert.Equal(t, s, tr.Session, "rollout %d has turns of two sessions", tr.RolloutID)
		}
		sessions[tr.RolloutID] = tr.Session
	}
	assert.Len(t, sessions, len(rows))
	segRollouts := map[int64]bool{}
	for _, s := range readSegments(t, w.st, res.Trajectories.Ref) {
		segRollouts[s.RolloutID] = true
	}
	assert.Len(t, segRollouts, len(rows))
}

// TestRunStopBetweenCommits: a stage killed after the turns commit, or
// after the rollouts commit, is completed by the rerun with the same
// versions and the same runs in all three.
func TestRunStopBetweenCommits(t *testing.T) {
	w := newRunWorld(t)
	for _, stopAt := range []int{1, 2} {
		t.Run(fmt.Sprintf("after commit %d", stopAt), func(t *testing.T) {
			model := newScriptedModel(w.set, func(fixtures.Task, int) behaviour { return lookAround })
			o := w.options(startEngine(t, model.script))
			o.Samples = 1
			name := fmt.Sprintf("rollout/stop-%d", stopAt)
			type killed struct{}
			commits := 0
			hook := func(point string) {
				if point == dataset.HookBeforeLatest {
					if commits++; commits == stopAt {
						panic(killed{})
					}
				}
			}
			func() {
				defer func() {
					_, ok := recover().(killed)
					require.True(t, ok, "the stage was not stopped at commit %d", stopAt)
				}()
				w.run(t, context.Background(), name, o, hook)
			}()
			res, err, logs := w.run(t, context.Background(), name, o, nil)
			require.NoError(t, err, logs)
			rows := readRollouts(t, w.st, res.Rollouts.Ref)
			require.Len(t, rows, len(w.set.Tasks))
			ids := map[int64]bool{}
			for _, tr := range readTurns(t, w.st, res.Turns.Ref) {
				ids[tr.RolloutID] = true
			}
			assert.Len(t, ids, len(rows))
			assert.Equal(t, res.Rollouts.Ref.Version, res.Trajectories.Ref.Version)
		})
	}
}

// TestRunEngineUnhealthy: an engine that fails its health check mid-run
// ends its running runs as engine_error rows; with no engine left the
// stage stops with an error, and the rerun against a healthy engine runs
// only the rest.
func TestRunEngineUnhealthy(t *testing.T) {
	w := newRunWorld(t)
	model := newScriptedModel(w.set, func(fixtures.Task, int) behaviour { return hang })
	eng := enginetest.New(enginetest.Options{Script: model.script, MaxModelLen: 1 << 16})
	srv := httptest.NewServer(eng)
	t.Cleanup(srv.Close)
	o := w.options(srv.URL)
	o.Samples, o.Jobs, o.Budget, o.HealthInterval = 1, 2, time.Minute, 200*time.Millisecond
	go func() {
		// Once both running agents made their call, the engine goes bad.
		for len(model.behaviours()) < 2 {
			time.Sleep(20 * time.Millisecond)
		}
		eng.SetHealthy(false)
	}()
	start := time.Now()
	_, err, logs := w.run(t, context.Background(), "rollout/unhealthy", o, nil)
	require.ErrorIs(t, err, errNoEngine, logs)
	assert.Less(t, time.Since(start), o.Budget, "the runs were not ended when their engine failed")

	healthy := newScriptedModel(w.set, func(fixtures.Task, int) behaviour { return lookAround })
	o.Engines = []string{startEngine(t, healthy.script)}
	res, err, logs := w.run(t, context.Background(), "rollout/unhealthy", o, nil)
	require.NoError(t, err, logs)
	rows := readRollouts(t, w.st, res.Rollouts.Ref)
	require.Len(t, rows, len(w.set.Tasks))
	reasons := map[string]int{}
	for _, r := range rows {
		reasons[deref(r.AbortReason)]++
		if r.AbortReason != nil {
			assert.Regexp(t, `^engine 0 failed its health check: `, deref(r.AbortDetail), r.TaskID)
		}
	}
	assert.Equal(t, map[string]int{AbortEngineError: 2, "": len(rows) - 2}, reasons, logs)
}

// TestRunUsage: bad arguments, an unknown harness and a CLI install that
// is not there are usage errors (exit 2) before any sandbox boots or any version is written.
func TestRunUsage(t *testing.T) {
	w := newRunWorld(t)
	up := startEngine(t, newScriptedModel(w.set, func(fixtures.Task, int) behaviour { return lookAround }).script)
	base := []string{"run", "--store", w.storeDir, "--tasks", w.tasks, "--images", w.images, "--bundles", w.bundles,
		"--tokenizer-dir", w.tokenizer, "--agent-binary", filepath.Join(w.tools, "kiln-agent"), "--out", "rollout/usage"}
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"no engine", nil, "--engine"},
		{"codex install missing", []string{"--engine", up, "--agent", "codex", "--codex", "/nonexistent/codex"}, "/nonexistent/codex"},
		{"claude install empty", []string{"--engine", up, "--agent", "claude-code", "--claude-code", w.tokenizer}, "no native claude binary"},
		{"bad agent args", []string{"--engine", up, "--agent-args", `{"aider":["-x"]}`}, "--agent-args"},
		{"bad agent env", []string{"--engine", up, "--agent-env", `{"A":1}`}, "--agent-env"},
		{"unknown harness", []string{"--engine", up, "--agent", "aider"}, "unknown harness"},
		{"no samples", []string{"--engine", up, "--samples", "0"}, "--samples"},
		// Issue 31: absurd counts are refused before anything is planned.
		{"absurd samples", []string{"--engine", up, "--samples", "100000000000"}, "--samples 100000000000: want 1 to 65536"},
		{"absurd jobs", []string{"--engine", up, "-j", "100000"}, "--jobs 100000: want 1 to 4096"},
		{"absurd boot concurrency", []string{"--engine", up, "--boot-concurrency", "5000"}, "--boot-concurrency 5000: want 1 to 4096"},
		{"bad top-p", []string{"--engine", up, "--top-p", "1.5"}, "--top-p"},
		{"bad kwargs", []string{"--engine", up, "--chat-template-kwargs", "[1]"}, "--chat-template-kwargs"},
		{"bad stop ids", []string{"--engine", up, "--stop-token-ids", "1,x"}, "--stop-token-ids"},
		{"no bundles", []string{"--engine", up, "--bundles", ""}, "--bundles"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := stagetest.Run(t, stageCommands, append(append([]string(nil), base...), c.args...)...)
			assert.Equal(t, 2, r.Code, r.Stderr)
			assert.Contains(t, r.Stderr, c.want)
		})
	}
	_, err := dataset.OpenString(context.Background(), w.st, "rollout/usage/rollouts")
	assert.Error(t, err)
}

// TestCheck: kiln-rollout check rolls out and grades, prints each task's
// rewards, and fails unless some sample earns reward 1; one sample per task
// is warned about.
func TestCheck(t *testing.T) {
	w := newRunWorld(t)
	cases := []struct {
		name    string
		do      func(nth int) behaviour
		samples string
		code    int
		want    []string
	}{
		{"some fix", func(nth int) behaviour { return []behaviour{fixIt, lookAround}[nth%2] }, "2", 0,
			[]string{"check: " + w.set.Tasks[0].ID + ": ", "4 of 8 samples earned reward 1"}},
		{"none fixes", func(int) behaviour { return lookAround }, "1", 1,
			[]string{"warning: --samples 1", "0 of 4 samples earned reward 1", "no sample earned reward 1"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			model := newScriptedModel(w.set, func(_ fixtures.Task, nth int) behaviour { return c.do(nth) })
			r := stagetest.Run(t, stageCommands, "check", "--store", w.storeDir, "--tasks", w.tasks, "--images", w.images,
				"--bundles", w.bundles, "--engine", startEngine(t, model.script), "--tokenizer-dir", w.tokenizer, "--mode", "generate",
				"--agent-binary", filepath.Join(w.tools, "kiln-agent"), "--samples", c.samples, "-j", "4",
				"--out", "check/"+strings.ReplaceAll(c.name, " ", "-"))
			assert.Equal(t, c.code, r.Code, r.Stderr)
			for _, s := range c.want {
				assert.Contains(t, r.Stderr, s)
			}
		})
	}
}

// TestRunShards: --shard i/n runs every n-th task; each part writes its
// share of all three versions and the last part commits them.
func TestRunShards(t *testing.T) {
	w := newRunWorld(t)
	model := newScriptedModel(w.set, func(fixtures.Task, int) behaviour { return lookAround })
	o := w.options(startEngine(t, model.script))
	o.Samples = 1
	var res RunResults
	for i := range 2 {
		var stdout, stderr strings.Builder
		env := w.env(&stdout)
		env.Stderr = &stderr
		var err error
		res, err = Run(context.Background(), env, w.st, RunOutput{Name: "rollout/shards", Part: dataset.Part{Index: i, Count: 2}}, o)
		require.NoError(t, err, stderr.String())
		assert.Equal(t, i == 0, res.Trajectories.Pending, "part %d", i)
	}
	rows := readRollouts(t, w.st, res.Rollouts.Ref)
	require.Len(t, rows, len(w.set.Tasks))
	groups := map[int64]bool{}
	for _, r := range rows {
		groups[r.GroupIndex] = true
	}
	assert.Len(t, groups, len(w.set.Tasks))
	assert.Len(t, readTurns(t, w.st, res.Turns.Ref), 2*len(w.set.Tasks))
}

// TestRunIsolation: an agent cannot speak in another run's session (a
// finished run's token and a guessed one are refused, and nothing of those
// requests is recorded), and sees neither the store nor other sandboxes.
func TestRunIsolation(t *testing.T) {
	w := newRunWorld(t)
	model := newScriptedModel(w.set, func(_ fixtures.Task, nth int) behaviour {
		if nth == 0 {
			return lookAround
		}
		return snoop
	})
	model.snoop = func(earlier []string) string {
		tokens := []string{"kiln-" + strings.Repeat("0", 32)}
		tokens = append(tokens, earlier...)
		list, _ := json.Marshal(tokens)
		return `python3 - <<'PY'
import urllib.request as u, urllib.error as e
for tok in ` + string(list) + `:
    r = u.Request("http://127.0.0.1:18080/v1/chat/completions", data=b'{"messages":[{"role":"user","content":"x"}]}',
                  headers={"Authorization": "Bearer " + tok, "Content-Type": "application/json"})
    try:
        u.urlopen(r)
        print("token accepted")
    except e.HTTPError as x:
        print("token refused", x.code)
PY
test -e ` + w.storeDir + ` && echo store-visible || echo store-hidden
ls /tmp /run/kiln`
	}
	o := w.options(startEngine(t, model.script))
	o.Jobs = 1 // the first sample of a task is finished before the second starts
	res, err, logs := w.run(t, context.Background(), "rollout/isolation", o, nil)
	require.NoError(t, err, logs)
	rows := readRollouts(t, w.st, res.Rollouts.Ref)
	require.Len(t, rows, 2*len(w.set.Tasks))
	perRollout := map[int64]int{}
	checked := 0
	for _, tr := range readTurns(t, w.st, res.Turns.Ref) {
		perRollout[tr.RolloutID]++
		if model.behaviours()[tr.Session] == snoop && tr.Turn == 1 {
			checked++
			var msgs []struct{ Role, Content string }
			require.NoError(t, json.Unmarshal([]byte(tr.PromptMessages), &msgs))
			out := msgs[len(msgs)-1]
			require.Equal(t, "tool", out.Role)
			assert.NotContains(t, out.Content, "token accepted")
			assert.Contains(t, out.Content, "token refused 401")
			assert.Contains(t, out.Content, "store-hidden")
		}
	}
	assert.Equal(t, len(w.set.Tasks), checked)
	for id, n := range perRollout {
		assert.Equal(t, 2, n, "rollout %d: a refused request was recorded", id)
	}
}

// TestRunTaskAgent: a task's agent column overrides --agent: tasks naming
// shell run under another default (never built, as no task uses it), and a
// task naming an unknown harness stops the stage before any run.
func TestRunTaskAgent(t *testing.T) {
	w := newRunWorld(t)
	ctx := context.Background()
	model := newScriptedModel(w.set, func(fixtures.Task, int) behaviour { return lookAround })
	o := w.options(startEngine(t, model.script))
	o.Samples, o.Agent = 1, "codex"

	o.Tasks = writeTasksWithAgents(t, w, "tasks-shell", "shell", "Shell")
	res, err, logs := w.run(t, ctx, "rollout/task-agent", o, nil)
	require.NoError(t, err, logs)
	for _, r := range readRollouts(t, w.st, res.Rollouts.Ref) {
		assert.Equal(t, "shell", r.Agent)
		assert.Nil(t, r.AbortReason, r.TaskID)
	}

	o.Agent = "shell"
	o.Tasks = writeTasksWithAgents(t, w, "tasks-mixed", "shell", "aider")
	_, err, _ = w.run(t, ctx, "rollout/task-agent-mixed", o, nil)
	assert.Equal(t, 2, stagecmd.ExitCode(err), "%v", err)
	assert.ErrorContains(t, err, `unknown harness "aider"`)
}
