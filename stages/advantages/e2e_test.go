package advantages_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/internal/sandbox"
	"github.com/kilnrl/kiln/internal/stagecmd"
	"github.com/kilnrl/kiln/stages/advantages"
	"github.com/kilnrl/kiln/stages/grade"
)

// noUsers is a local (host) sandbox that skips the agent-user setup, which
// would change the host's users: the commands that matter here (apply the
// patch, run the task's test) run as they would in a real sandbox.
type noUsers struct{ sandbox.Sandbox }

func (s noUsers) Exec(ctx context.Context, c sandbox.Cmd) (sandbox.Result, error) {
	if strings.Contains(c.Shell, "useradd") || strings.Contains(c.Shell, "chown -R agent") {
		return sandbox.Result{}, nil
	}
	return s.Sandbox.Exec(ctx, c)
}

func git(t *testing.T, dir string, args ...string) string {
	t.Helper()
	out, err := exec.Command("git", append([]string{"-C", dir}, args...)...).CombinedOutput()
	require.NoError(t, err, "git %v: %s", args, out)
	return string(out)
}

func put(t *testing.T, st store.Store, name string, kind records.Kind, inputs []dataset.Ref, rows int, encode func(io.Writer) error) dataset.Ref {
	t.Helper()
	ctx := context.Background()
	w, err := dataset.NewWriter(ctx, st, dataset.Spec{Name: name, Kind: kind, Identity: dataset.Identity{Stage: "test", Inputs: inputs, Args: map[string]any{"t": t.Name()}}})
	require.NoError(t, err)
	_, err = w.WriteShard(ctx, int64(rows), nil, encode)
	require.NoError(t, err)
	res, err := w.Commit(ctx, nil)
	require.NoError(t, err)
	return res.Ref
}

// The chain rollouts -> kiln-grade -> kiln-advantages: the rollouts (and
// their trajectories; there is no rollout stage yet) are written through the
// records and dataset APIs, the grades by grade.Run itself, running each
// task's eval_cmd on the patched repository in a host (local provider)
// sandbox. Samples that fix the bug get positive advantages on every
// segment, the others negative, and the aborted sample is left out and
// counted.
func TestChainRolloutsGradesAdvantages(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is not installed")
	}
	ctx := context.Background()
	st, err := store.NewLocal(t.TempDir())
	require.NoError(t, err)
	var logs bytes.Buffer
	env := &stagecmd.Env{Stdout: &bytes.Buffer{}, Stderr: &logs, Log: stagecmd.NewLogger(&logs, false)}

	repo := filepath.Join(t.TempDir(), "repo")
	require.NoError(t, os.MkdirAll(repo, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(repo, "fixed.txt"), []byte("broken\n"), 0o644))
	git(t, repo, "init", "-q", "-b", "main")
	git(t, repo, "add", "-A")
	git(t, repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "base")
	patchTo := func(body string) string {
		require.NoError(t, os.WriteFile(filepath.Join(repo, "fixed.txt"), []byte(body), 0o644))
		d := git(t, repo, "diff", "--binary")
		git(t, repo, "checkout", "-q", "--", ".")
		return d
	}
	fix, nofix := patchTo("fixed\n"), patchTo("still broken\n")

	grading, _ := json.Marshal(map[string]string{"kind": "eval_cmd", "eval_cmd": "grep -qx fixed fixed.txt"})
	gs, image := string(grading), "img:fix"
	tasks := put(t, st, "tasks", records.TasksKind(), nil, 1, func(out io.Writer) error {
		enc := records.NewTaskEncoder(out)
		if err := enc.Write(records.Task{TaskID: "fixture-fix-001", Prompt: `"fix it"`, Metadata: "{}", Image: &image, Workdir: &repo, Grading: &gs}); err != nil {
			return err
		}
		return enc.Close()
	})
	bundles := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(bundles, "b1", "rootfs"), 0o755))
	images := put(t, st, "images", records.ImagesKind(), nil, 1, func(out io.Writer) error {
		enc := records.NewImageEncoder(out)
		if err := enc.Write(records.Image{Image: image, Digest: "sha256:" + strings.Repeat("0", 64), Bundle: "b1", Env: `{"PATH":"/usr/bin:/bin"}`, Command: "[]"}); err != nil {
			return err
		}
		return enc.Close()
	})

	// Samples 0 and 2 fix the bug, 1 and 3 do not, 4 was aborted; sample
	// r has r%3+1 segments.
	fixing := map[int64]bool{0: true, 2: true}
	aborted := "wall_clock_timeout"
	var rollouts []records.Rollout
	var segs []records.Trajectory
	for r := int64(0); r < 5; r++ {
		ro := records.Rollout{RolloutID: r, Index: r, Sample: r, TaskID: "fixture-fix-001", Agent: "shell", WeightsVersion: "w0", Patch: nofix}
		if fixing[r] {
			ro.Patch = fix
		}
		if r == 4 {
			ro.AbortReason = &aborted
		}
		rollouts = append(rollouts, ro)
		for s := int32(0); s <= int32(r%3); s++ {
			segs = append(segs, records.Trajectory{RolloutID: r, Index: r, Segment: s, Tokens: []int32{1, 2, 3, 4}, ResponseLength: 3,
				LossMask: []uint8{1, 0, 1}, RolloutLogProbs: []float32{-0.1, 0, -0.2}})
		}
	}
	rref := put(t, st, "rollouts", records.RolloutsKind(), []dataset.Ref{tasks}, len(rollouts), func(out io.Writer) error {
		enc := records.NewRolloutEncoder(out)
		if err := enc.Write(rollouts...); err != nil {
			return err
		}
		return enc.Close()
	})
	tref := put(t, st, "trajectories", records.TrajectoriesKind(), []dataset.Ref{rref}, len(segs), func(out io.Writer) error {
		enc, err := records.NewTrajectoryEncoder(out, records.ArrowOptions{})
		if err != nil {
			return err
		}
		if err := enc.Write(segs...); err != nil {
			return err
		}
		return enc.Close()
	})

	g := &grade.Grader{
		Boot: func(ctx context.Context, o sandbox.Options) (sandbox.Sandbox, error) {
			git(t, repo, "checkout", "-q", "--", ".") // a real sandbox starts from the image every time
			git(t, repo, "clean", "-qfdx")
			o.Provider, o.Rootfs, o.StateDir, o.Log = "local", repo, t.TempDir(), env.Log
			sb, err := sandbox.Boot(ctx, o)
			if err != nil {
				return nil, err
			}
			return noUsers{sb}, nil
		},
		Timeout: time.Minute, Scratch: t.TempDir(),
	}
	gres, err := grade.Run(ctx, env, st, stagecmd.Output{Name: "grades"}, grade.Options{Tasks: tasks.String(), Images: images.String(),
		Bundles: bundles, Rollouts: rref.String(), Jobs: 1, Timeout: time.Minute, Provider: "local", Grader: g})
	require.NoError(t, err, logs.String())

	ares, err := advantages.Run(ctx, env, st, stagecmd.Output{Name: "advantages"}, advantages.RunOptions{
		Trajectories: tref.String(), Grades: gres.Ref.String(),
		Options: advantages.Options{Estimator: advantages.GRPO, StdEps: 1e-6, Infra: advantages.InfraExclude, MinGroupSize: 2}})
	require.NoError(t, err, logs.String())
	v, err := dataset.Open(ctx, st, ares.Ref)
	require.NoError(t, err)
	var rows []records.Advantage
	require.NoError(t, v.EachShard(ctx, func(_ int, data []byte) error {
		return records.EachAdvantage(data, func(a *records.Advantage) error { rows = append(rows, *a); return nil })
	}))
	require.Len(t, rows, 1+2+3+1, "the aborted sample's 2 segments are left out")
	for _, a := range rows {
		if fixing[a.RolloutID] {
			assert.InDelta(t, 0.866024, a.Advantage, 1e-6, "fixing sample %d", a.RolloutID)
		} else {
			assert.InDelta(t, -0.866024, a.Advantage, 1e-6, "non-fixing sample %d", a.RolloutID)
		}
		assert.Equal(t, int64(2*(a.RolloutID%3+1)), a.RolloutTrainedTokens)
	}
	m, _ := json.Marshal(v.Metrics)
	assert.Contains(t, string(m), `"dropped_rollouts":{"infra_failure":1}`)
	assert.Contains(t, string(m), `"dropped_rows":{"infra_failure":2}`)
}
