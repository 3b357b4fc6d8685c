package sync

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	gosync "sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/internal/stagecmd"
	"github.com/kilnrl/kiln/stages/sync/synctest"
)

// TestCLIHelp: every form's --help is its manual, with examples and the
// exit status table, on stdout, exit 0; kiln-sync alone shows it too.
func TestCLIHelp(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {}, {"publish", "--help"}, {"pull", "--help"}, {"reload", "--help"}, {"help", "pull"}} {
		r := run(t, args...)
		require.Equal(t, 0, r.Code, "%q: %s", args, r.Stderr)
		assert.Contains(t, r.Stdout, "EXIT STATUS", "%q", args)
		assert.Contains(t, r.Stdout, "Examples:", "%q", args)
	}
	r := run(t, "--help")
	for _, cmd := range []string{"publish", "pull", "reload"} {
		assert.Contains(t, r.Stdout, cmd)
	}
}

// TestCLIUsageErrors: each exits 2 with one line pointing to --help, and
// nothing is done.
func TestCLIUsageErrors(t *testing.T) {
	s := t.TempDir()
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"pull", "--weights", "w", "--store", s}, "missing required flag --to"},
		{[]string{"pull", "--to", "d", "--store", s}, "missing required flag --weights"},
		{[]string{"pull", "--weights", "bad ref@", "--to", "d", "--store", s}, "--weights"},
		{[]string{"pull", "--weights", "w", "--to", "d", "extra", "--store", s}, "takes no arguments"},
		{[]string{"publish", "--out", "w", "--store", s}, "missing required flag --checkpoint"},
		{[]string{"reload", "--engine", "http://x:1", "--path", "/p", "--version", "3", "--protocol", "tgi"}, "--protocol"},
		{[]string{"reload", "--engine", "http://x:1", "--path", "/p"}, "missing required flag --version"},
		{[]string{"reload", "--path", "/p", "--version", "3"}, "missing required flag --engine"},
		{[]string{"reload", "--engine", "http://x:1", "--path", "/p", "--version", "0"}, "--version 0"},
		{[]string{"--checkpoint", "c", "--out", "w", "--store", s}, "missing required flag --to, --engine"},
		{[]string{"--checkpoint", "c", "--out", "w", "--to", "d", "--engine", "http://x:1", "--timeout", "0s", "--store", s}, "--timeout"},
		{[]string{"frobnicate"}, `"frobnicate" is not a command of kiln-sync`},
		{[]string{"pull", "--bogus"}, "flag provided but not defined: -bogus"},
	}
	for _, c := range cases {
		r := run(t, c.args...)
		assert.Equal(t, stagecmd.ExitUsage, r.Code, "%q: %s", c.args, r.Stderr)
		assert.Contains(t, r.Stderr, c.want, "%q", c.args)
		assert.Equal(t, 1, strings.Count(strings.TrimSpace(r.Stderr), "\n")+1, "%q: one line: %s", c.args, r.Stderr)
		assert.Empty(t, r.Stdout, "%q", c.args)
	}
	_, err := os.Stat(filepath.Join(s, "w"))
	assert.ErrorIs(t, err, os.ErrNotExist, "nothing written")
}

// fakeVLLM is an engine speaking docs/sync.md §3's vLLM protocol.
type fakeVLLM struct {
	mu      gosync.Mutex
	path    string
	version string
	calls   []string
}

func (e *fakeVLLM) handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.mu.Lock()
		defer e.mu.Unlock()
		e.calls = append(e.calls, r.Method+" "+r.URL.Path)
		var body map[string]any
		json.NewDecoder(r.Body).Decode(&body)
		switch r.URL.Path {
		case "/pause", "/resume", "/reset_prefix_cache":
		case "/collective_rpc":
			kw, _ := body["kwargs"].(map[string]any)
			e.path, _ = kw["weights_path"].(string)
		case "/update_weight_version":
			e.version, _ = body["new_version"].(string)
		case "/v1/models":
			json.NewEncoder(w).Encode(map[string]any{"data": []any{map[string]any{"id": "m", "weight_version": e.version}}})
		default:
			http.NotFound(w, r)
		}
	})
}

// TestCLICombined: --print-version prints the reference and does nothing;
// the combined form publishes, pulls into --to and reloads the engine from
// the pulled directory as the version's number, and prints that same
// reference as its last stdout line; a second checkpoint goes the same
// way as a delta on the first, xor against --to.
func TestCLICombined(t *testing.T) {
	s, to := t.TempDir(), filepath.Join(t.TempDir(), "weights")
	eng := &fakeVLLM{}
	srv := httptest.NewServer(eng.handler())
	defer srv.Close()
	ck := synctest.Tiny(21, 2, 4, 512)
	ckDir := t.TempDir()
	require.NoError(t, ck.Write(ckDir))
	args := []string{"--checkpoint", ckDir, "--out", "weights/tiny", "--to", to, "--engine", srv.URL, "--store", s}

	pv := run(t, append(args, "--print-version")...)
	require.Equal(t, 0, pv.Code, pv.Stderr)
	ref := strings.TrimSpace(pv.Stdout)
	require.Regexp(t, `^weights/tiny@[A-Za-z0-9]`, ref)
	_, err := os.Stat(to)
	assert.ErrorIs(t, err, os.ErrNotExist, "--print-version pulled nothing")
	assert.Empty(t, eng.calls, "--print-version called no engine")

	r := run(t, args...)
	require.Equal(t, 0, r.Code, r.Stderr)
	assert.Equal(t, ref, r.LastLine(), "the committed reference is the last line, as --print-version said")
	parsed, err := dataset.ParseRef(ref)
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(to, versionDirName(1, parsed.Version)), eng.path, "the engine loads the pulled directory")
	assert.Equal(t, "1", eng.version)
	assert.Equal(t, "POST /resume", eng.calls[len(eng.calls)-1], "the engine is resumed")
	requireHeld(t, to, parsed, engineFiles(t, ck, ckDir))

	mutate(ck, 0.5, 22)
	require.NoError(t, ck.Write(ckDir))
	r = run(t, args...)
	require.Equal(t, 0, r.Code, r.Stderr)
	parsed2, err := dataset.ParseRef(r.LastLine())
	require.NoError(t, err)
	assert.NotEqual(t, parsed.Version, parsed2.Version)
	assert.Equal(t, filepath.Join(to, versionDirName(2, parsed2.Version)), eng.path)
	assert.Equal(t, "2", eng.version)
	requireHeld(t, to, parsed2, engineFiles(t, ck, ckDir))
	st, err := store.Open(s)
	require.NoError(t, err)
	w, err := openWeights(context.Background(), st, parsed2)
	require.NoError(t, err)
	assert.False(t, w.Full, "a delta: %s", w.FullReason)

	// pull alone prints the directory reload takes.
	p := run(t, "pull", "--weights", parsed.String(), "--to", t.TempDir(), "--store", s)
	require.Equal(t, 0, p.Code, p.Stderr)
	assert.True(t, strings.HasSuffix(p.LastLine(), "/"+versionDirName(1, parsed.Version)), p.Stdout)
}

// TestPullKilled: a pull SIGKILLed at each of its steps leaves the
// previous version held (state.json, current and its bytes) until its
// state is written; a rerun completes it, removing what the killed one
// left.
func TestPullKilled(t *testing.T) {
	s := t.TempDir()
	st, err := store.Open(s)
	require.NoError(t, err)
	f := newFixture(t, st)
	ck := synctest.Tiny(31, 3, 3, 512)
	v1, files1 := f.publish(ck, pubOpts{})
	mutate(ck, 0.5, 32)
	v2, files2 := f.publish(ck, pubOpts{})
	for _, point := range []string{HookPullSeeded, HookPullApplied, HookPullRenamed, HookPullState} {
		t.Run(point, func(t *testing.T) {
			dir := t.TempDir()
			_, err := f.pull(v1, dir)
			require.NoError(t, err)
			cmd := exec.Command(os.Args[0], "pull", "--store", s, "--weights", v2.String(), "--to", dir)
			cmd.Env = append(os.Environ(), "KILN_TEST_HELPER=1", "KILN_TEST_PAUSE_AT="+point)
			stderr, err := cmd.StdoutPipe()
			require.NoError(t, err)
			cmd.Stderr = cmd.Stdout
			require.NoError(t, cmd.Start())
			paused := make(chan bool, 1)
			go func() {
				sc := bufio.NewScanner(stderr)
				for sc.Scan() {
					if sc.Text() == "PAUSED "+point {
						paused <- true
						return
					}
				}
				paused <- false
			}()
			select {
			case ok := <-paused:
				require.True(t, ok, "the pull reached %s", point)
			case <-time.After(30 * time.Second):
				cmd.Process.Kill()
				t.Fatalf("the pull did not reach %s", point)
			}
			require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
			cmd.Wait()

			s, md, err := heldVersion(dir)
			require.NoError(t, err)
			cur, err := os.Readlink(filepath.Join(dir, currentLink))
			require.NoError(t, err)
			if point == HookPullState {
				assert.Equal(t, v2.Version, s.Version, "the state is the commit point")
				requireSameFiles(t, files2, md)
			} else {
				assert.Equal(t, v1.Version, s.Version, "the previous version is still held")
				assert.Equal(t, s.Dir, cur)
				requireSameFiles(t, files1, md)
			}
			r, err := f.pull(v2, dir)
			require.NoError(t, err)
			assert.Equal(t, point == HookPullState, r.AlreadyHeld)
			requireHeld(t, dir, v2, files2)
		})
	}
}
