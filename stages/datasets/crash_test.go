package datasets_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/internal/testenv"
)

// writer is a kiln writer running in a separate process (the test binary in
// helper mode, see TestMain).
type writer struct {
	cmd     *exec.Cmd
	stdout  bytes.Buffer
	stderr  *testenv.Buffer
	paused  chan string
	drained chan struct{} // closed when stderr reached EOF
}

func startWriter(t *testing.T, sc storeCase, extraEnv []string, args ...string) *writer {
	t.Helper()
	w := &writer{stderr: &testenv.Buffer{}, paused: make(chan string, 1)}
	w.cmd = exec.Command(os.Args[0], args...)
	w.cmd.Env = append(append(append(os.Environ(), "KILN_TEST_HELPER=1", "KILN_STORE="+sc.uri), sc.env...), extraEnv...)
	w.cmd.Stdout = &w.stdout
	pr, err := w.cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, w.cmd.Start())
	w.drained = make(chan struct{})
	go func() {
		defer close(w.drained)
		defer close(w.paused)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			line := sc.Text()
			w.stderr.Write([]byte(line + "\n"))
			if p, ok := strings.CutPrefix(line, "PAUSED "); ok {
				w.paused <- p
			}
		}
	}()
	t.Cleanup(func() { w.cmd.Process.Kill() })
	return w
}

func (w *writer) waitPaused(t *testing.T) {
	t.Helper()
	select {
	case _, ok := <-w.paused:
		if !ok {
			t.Fatalf("writer exited before pausing; stderr:\n%s", w.stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("writer never paused; stderr:\n%s", w.stderr.String())
	}
}

func (w *writer) wait(t *testing.T) result {
	t.Helper()
	<-w.drained
	err := w.cmd.Wait()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else {
		require.NoError(t, err)
	}
	return result{Stdout: w.stdout.String(), Stderr: w.stderr.String(), Code: code}
}

func runWriter(t *testing.T, sc storeCase, args ...string) result {
	t.Helper()
	return startWriter(t, sc, nil, args...).wait(t)
}

// storeKeys lists every key in the store, and the store's leftovers.
func storeKeys(t *testing.T, st store.Store) []string {
	t.Helper()
	var keys []string
	require.NoError(t, st.List(context.Background(), "", func(info store.Info) error {
		keys = append(keys, info.Key)
		return nil
	}))
	if sw, ok := st.(store.Sweeper); ok {
		require.NoError(t, sw.Leftovers(context.Background(), time.Now().Add(time.Hour), func(info store.Info) error {
			keys = append(keys, info.Key)
			return nil
		}))
	}
	sort.Strings(keys)
	return keys
}

// gcDryRun returns the keys kiln gc --dry-run --grace 0s lists.
func gcDryRun(t *testing.T, sc storeCase) []string {
	t.Helper()
	r := runWriter(t, sc, "gc", "--dry-run", "--grace", "0s")
	require.Equal(t, 0, r.Code, r.Stderr)
	var keys []string
	for _, line := range strings.Split(strings.TrimSpace(r.Stdout), "\n") {
		if k, ok := strings.CutPrefix(line, "would remove "); ok && strings.Contains(k, " (") {
			keys = append(keys, k[:strings.Index(k, " (")])
		}
	}
	sort.Strings(keys)
	return keys
}

func TestKilledWriterLeavesNoVersion(t *testing.T) {
	points := []string{dataset.HookShardPartial, dataset.HookShardWritten, dataset.HookPartReceipted, dataset.HookBeforeCommit}
	eachStore(t, func(t *testing.T, sc storeCase) {
		ctx := context.Background()
		want := runWriter(t, sc, "import", "tasks", "--print-version", referenceRows).LastLine()
		for _, point := range points {
			w := startWriter(t, sc, []string{"KILN_TEST_PAUSE_AT=" + point}, "import", "tasks", referenceRows)
			w.waitPaused(t)
			require.NoError(t, w.cmd.Process.Signal(syscall.SIGKILL))
			r := w.wait(t)
			require.Equal(t, -1, r.Code, "killed at %s", point)

			all, err := dataset.List(ctx, sc.st, "")
			require.NoError(t, err)
			require.Empty(t, all, "a version became visible after a kill at %s", point)
			_, err = dataset.OpenString(ctx, sc.st, "tasks")
			require.ErrorIs(t, err, dataset.ErrNotFound)

			// gc --dry-run lists exactly what the killed writers left.
			left := storeKeys(t, sc.st)
			if point != dataset.HookShardPartial || sc.env == nil {
				require.NotEmpty(t, left, "killed at %s", point)
			}
			assert.Equal(t, left, gcDryRun(t, sc), "killed at %s", point)
		}
		// Rerunning the same command completes the version.
		done := runWriter(t, sc, "import", "tasks", referenceRows)
		require.Equal(t, 0, done.Code, done.Stderr)
		assert.Equal(t, want, done.LastLine())
		v, err := dataset.OpenString(ctx, sc.st, "tasks")
		require.NoError(t, err)
		assert.Equal(t, int64(4), v.Rows)
		exp := runWriter(t, sc, "export", want)
		require.Equal(t, 0, exp.Code, exp.Stderr)
		assert.Equal(t, 4, strings.Count(exp.Stdout, "\n"))
	})
}

func TestTwoProcessesCommitOneVersion(t *testing.T) {
	eachStore(t, func(t *testing.T, sc storeCase) {
		resume := filepath.Join(t.TempDir(), "go")
		env := []string{"KILN_TEST_PAUSE_AT=" + dataset.HookBeforeCommit, "KILN_TEST_RESUME_FILE=" + resume}
		a := startWriter(t, sc, env, "import", "tasks", referenceRows)
		b := startWriter(t, sc, env, "import", "tasks", referenceRows)
		a.waitPaused(t)
		b.waitPaused(t)
		require.NoError(t, os.WriteFile(resume, nil, 0o644))
		ra, rb := a.wait(t), b.wait(t)
		require.Equal(t, 0, ra.Code, ra.Stderr)
		require.Equal(t, 0, rb.Code, rb.Stderr)
		assert.Equal(t, ra.LastLine(), rb.LastLine())
		winners := strings.Count(ra.Stderr+rb.Stderr, "msg=committed")
		assert.Equal(t, 1, winners, "exactly one commit:\n%s\n%s", ra.Stderr, rb.Stderr)
		assert.Equal(t, 1, strings.Count(ra.Stderr+rb.Stderr, "another run committed this version first"))
		all, err := dataset.List(context.Background(), sc.st, "")
		require.NoError(t, err)
		assert.Len(t, all, 1)
	})
}

func TestShardedProcesses(t *testing.T) {
	eachStore(t, func(t *testing.T, sc storeCase) {
		ctx := context.Background()
		const n = 4
		rows := filepath.Join(t.TempDir(), "rows.jsonl")
		var buf bytes.Buffer
		for i := 0; i < 40; i++ {
			fmt.Fprintf(&buf, `{"prompt": [{"role": "user", "content": "task %d"}], "label": "t%02d", "metadata": {"instance_id": "t%02d", "k": %d}}`+"\n", i, i, i, i)
		}
		require.NoError(t, os.WriteFile(rows, buf.Bytes(), 0o644))

		// A duplicate attempt of part 2 that writes its shard, then stalls
		// until the version is committed.
		resume := filepath.Join(t.TempDir(), "go")
		dup := startWriter(t, sc, []string{"KILN_TEST_PAUSE_AT=" + dataset.HookShardWritten, "KILN_TEST_RESUME_FILE=" + resume},
			"import", "tasks", "--shard", fmt.Sprintf("2/%d", n), rows)
		dup.waitPaused(t)

		var ws []*writer
		for i := 0; i < n; i++ {
			ws = append(ws, startWriter(t, sc, nil, "import", "tasks", "--shard", fmt.Sprintf("%d/%d", i, n), rows))
		}
		var refs []string
		var logs string
		for i, w := range ws {
			r := w.wait(t)
			require.Equal(t, 0, r.Code, "part %d: %s", i, r.Stderr)
			refs = append(refs, r.LastLine())
			logs += r.Stderr
		}
		for _, r := range refs {
			assert.Equal(t, refs[0], r)
		}
		assert.Equal(t, 1, strings.Count(logs, "msg=committed"), logs)
		v, err := dataset.OpenString(ctx, sc.st, refs[0])
		require.NoError(t, err)
		assert.Equal(t, n, v.Parts)
		assert.Len(t, v.Shards, n)
		assert.Equal(t, int64(40), v.Rows)
		before := v.Manifest

		require.NoError(t, os.WriteFile(resume, nil, 0o644))
		rd := dup.wait(t)
		require.Equal(t, 0, rd.Code, rd.Stderr)
		assert.Equal(t, refs[0], rd.LastLine())
		late := runWriter(t, sc, "import", "tasks", "--shard", fmt.Sprintf("1/%d", n), rows)
		require.Equal(t, 0, late.Code, late.Stderr)
		assert.Contains(t, late.Stderr, "already committed")

		after, err := dataset.OpenString(ctx, sc.st, refs[0])
		require.NoError(t, err)
		assert.Equal(t, before, after.Manifest, "a late duplicate replaced nothing")
		exp := runWriter(t, sc, "export", refs[0])
		require.Equal(t, 0, exp.Code, exp.Stderr)
		got := readLines(t, strings.NewReader(exp.Stdout))
		require.Len(t, got, 40)
		seen := map[any]bool{}
		for _, row := range got {
			seen[row["label"]] = true
		}
		assert.Len(t, seen, 40, "every row exactly once")
	})
}
