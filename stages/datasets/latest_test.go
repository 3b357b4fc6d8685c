package datasets_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/formats/dataset"
)

// rowsFile writes a tasks JSONL file whose content (so whose version)
// differs with seed.
func rowsFile(t *testing.T, seed, n int) string {
	t.Helper()
	var buf bytes.Buffer
	for i := 0; i < n; i++ {
		fmt.Fprintf(&buf, `{"prompt": [{"role": "user", "content": "task %d of %d"}], "label": "t%d-%d", "metadata": {"instance_id": "t%d-%d"}}`+"\n", i, seed, seed, i, seed, i)
	}
	p := filepath.Join(t.TempDir(), fmt.Sprintf("rows-%d.jsonl", seed))
	require.NoError(t, os.WriteFile(p, buf.Bytes(), 0o644))
	return p
}

// latestVersion is the version the bare name resolves to.
func latestVersion(t *testing.T, sc storeCase, name string) string {
	t.Helper()
	v, err := dataset.OpenString(context.Background(), sc.st, name)
	require.NoError(t, err)
	return v.Ref().String()
}

// show and log say which version latest is and who moved it when; a rerun
// of an older version moves it back, quietly.
func TestShowAndLogSayLatest(t *testing.T) {
	eachStore(t, func(t *testing.T, sc storeCase) {
		a := kiln(t, "import", "tasks", "--store", sc.uri, rowsFile(t, 1, 2))
		require.Equal(t, 0, a.Code, a.Stderr)
		b := kiln(t, "import", "tasks", "--store", sc.uri, rowsFile(t, 2, 3))
		require.Equal(t, 0, b.Code, b.Stderr)
		refA, refB := a.LastLine(), b.LastLine()
		require.NotEqual(t, refA, refB)
		assert.Equal(t, refB, latestVersion(t, sc, "tasks"), "the last made")

		for _, c := range []struct {
			args []string
			want string // in the latest line
		}{
			{[]string{"show", "--rows", "0", "tasks"}, "latest     " + refB + " (this version), moved by import-tasks on "},
			{[]string{"show", "--rows", "0", refA}, "latest     " + refB + " (not this version), moved by import-tasks on "},
			{[]string{"show", "--rows", "0", refB}, " from " + strings.TrimPrefix(refA, "tasks@")},
			{[]string{"log", "tasks"}, "latest of tasks: " + refB + " (this version), moved by import-tasks on "},
			{[]string{"log", refA}, "latest of tasks: " + refB + " (not this version)"},
		} {
			r := kiln(t, append(append([]string{}, c.args[0], "--store", sc.uri), c.args[1:]...)...)
			require.Equal(t, 0, r.Code, "%v: %s", c.args, r.Stderr)
			assert.Contains(t, r.Stdout, c.want, "%v", c.args)
		}
		js := kiln(t, "show", "--store", sc.uri, "--rows", "0", "--json", refA)
		require.Equal(t, 0, js.Code, js.Stderr)
		var shown struct {
			Manifest dataset.Manifest
			Latest   struct {
				Version, Previous, Moved string
				By                       dataset.Mover
			}
		}
		require.NoError(t, json.Unmarshal([]byte(js.Stdout), &shown))
		assert.Equal(t, strings.TrimPrefix(refB, "tasks@"), shown.Latest.Version)
		assert.Equal(t, strings.TrimPrefix(refA, "tasks@"), shown.Latest.Previous)
		assert.Equal(t, "import-tasks", shown.Latest.By.Stage)
		assert.NotZero(t, shown.Latest.By.PID)
		assert.NotEmpty(t, shown.Latest.Moved)

		// Rerunning the first import finds its version committed, says so
		// once, quietly, and moves latest back to it.
		again := kiln(t, "import", "tasks", "--store", sc.uri, rowsFile(t, 1, 2))
		require.Equal(t, 0, again.Code, again.Stderr)
		assert.Equal(t, refA, again.LastLine())
		assert.Contains(t, again.Stderr, "already committed")
		assert.NotContains(t, again.Stderr, "another run committed")
		assert.NotContains(t, again.Stderr, "level=WARN")
		assert.Equal(t, refA, latestVersion(t, sc, "tasks"))
		// A later stage's unpinned input resolves the same way.
		exp := kiln(t, "export", "--store", sc.uri, "tasks")
		require.Equal(t, 0, exp.Code, exp.Stderr)
		assert.Equal(t, 2, strings.Count(exp.Stdout, "\n"))
	})
}

// A store written before pointers existed: its bare names keep meaning the
// newest committed version, and show says there is no pointer.
func TestNoPointerFallsBack(t *testing.T) {
	eachStore(t, func(t *testing.T, sc storeCase) {
		a := kiln(t, "import", "tasks", "--store", sc.uri, rowsFile(t, 1, 2))
		require.Equal(t, 0, a.Code, a.Stderr)
		require.NoError(t, sc.st.Delete(context.Background(), "tasks/_latest.json"))
		assert.Equal(t, a.LastLine(), latestVersion(t, sc, "tasks"))
		r := kiln(t, "show", "--store", sc.uri, "--rows", "0", "tasks")
		require.Equal(t, 0, r.Code, r.Stderr)
		assert.Contains(t, r.Stdout, "latest     no pointer: the bare name means the newest committed version")
	})
}

// A writer SIGKILLed between its commit and the pointer move leaves the bare
// name at the previous version (its own version is committed, and readable
// pinned); a rerun finds the version committed and moves the pointer.
func TestKilledBeforeLatestMove(t *testing.T) {
	eachStore(t, func(t *testing.T, sc storeCase) {
		ctx := context.Background()
		first := runWriter(t, sc, "import", "tasks", rowsFile(t, 1, 2))
		require.Equal(t, 0, first.Code, first.Stderr)
		second := rowsFile(t, 2, 3)

		w := startWriter(t, sc, []string{"KILN_TEST_PAUSE_AT=" + dataset.HookBeforeLatest}, "import", "tasks", second)
		w.waitPaused(t)
		require.NoError(t, w.cmd.Process.Signal(syscall.SIGKILL))
		require.Equal(t, -1, w.wait(t).Code)

		assert.Equal(t, first.LastLine(), latestVersion(t, sc, "tasks"), "the bare name stays at the previous version")
		all, err := dataset.List(ctx, sc.st, "tasks")
		require.NoError(t, err)
		require.Len(t, all, 2, "the killed writer's version is committed")
		killed := all[0].Ref
		if killed.String() == first.LastLine() {
			killed = all[1].Ref
		}
		v, err := dataset.Open(ctx, sc.st, killed)
		require.NoError(t, err)
		assert.Equal(t, int64(3), v.Rows)

		rerun := runWriter(t, sc, "import", "tasks", second)
		require.Equal(t, 0, rerun.Code, rerun.Stderr)
		assert.Equal(t, killed.String(), rerun.LastLine())
		assert.NotContains(t, rerun.Stderr, "another run committed")
		assert.Equal(t, killed.String(), latestVersion(t, sc, "tasks"), "the rerun moved the pointer")
		l, err := dataset.ReadLatest(ctx, sc.st, "tasks")
		require.NoError(t, err)
		assert.Equal(t, strings.TrimPrefix(first.LastLine(), "tasks@"), l.Previous)
	})
}

// Concurrent processes writing different versions of one name, released
// together right before they move the pointer: all succeed, and the pointer
// ends at one of their versions, whole, and resolves.
func TestConcurrentWritersOfOneName(t *testing.T) {
	eachStore(t, func(t *testing.T, sc storeCase) {
		const n = 4
		resume := filepath.Join(t.TempDir(), "go")
		env := []string{"KILN_TEST_PAUSE_AT=" + dataset.HookBeforeLatest, "KILN_TEST_RESUME_FILE=" + resume}
		var ws []*writer
		for i := 0; i < n; i++ {
			ws = append(ws, startWriter(t, sc, env, "import", "tasks", rowsFile(t, i, i+1)))
		}
		for _, w := range ws {
			w.waitPaused(t)
		}
		require.NoError(t, os.WriteFile(resume, nil, 0o644))
		refs := map[string]bool{}
		for i, w := range ws {
			r := w.wait(t)
			require.Equal(t, 0, r.Code, "writer %d: %s", i, r.Stderr)
			refs[r.LastLine()] = true
		}
		require.Len(t, refs, n, "n different versions")
		got := latestVersion(t, sc, "tasks")
		assert.True(t, refs[got], "the pointer ends at one of the writers' versions, not %s", got)
		l, err := dataset.ReadLatest(context.Background(), sc.st, "tasks")
		require.NoError(t, err)
		assert.True(t, l.Previous == "" || refs["tasks@"+l.Previous], "previous %q is one of the writers' versions", l.Previous)
		exp := runWriter(t, sc, "export", "tasks")
		require.Equal(t, 0, exp.Code, exp.Stderr)
		v, err := dataset.OpenString(context.Background(), sc.st, got)
		require.NoError(t, err)
		assert.Equal(t, int(v.Rows), strings.Count(exp.Stdout, "\n"))
	})
}
