package shellagent

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestEdit(t *testing.T) {
	cases := []struct {
		name    string
		files   map[string]string // before
		args    string
		wantOut string // prefix of the result
		isErr   bool
		after   map[string]string // files after ("" key absent: not checked)
	}{
		{"replace the one occurrence", map[string]string{"a.go": "x := 1\ny := 2\n"},
			`{"path":"a.go","old_str":"y := 2","new_str":"y := 3"}`, "edited a.go", false, map[string]string{"a.go": "x := 1\ny := 3\n"}},
		{"replace with nothing", map[string]string{"a.go": "keep drop keep"},
			`{"path":"a.go","old_str":" drop","new_str":""}`, "edited a.go", false, map[string]string{"a.go": "keep keep"}},
		{"not found", map[string]string{"a.go": "abc"},
			`{"path":"a.go","old_str":"zzz","new_str":"y"}`, "error: edit a.go: old_str does not occur", true, map[string]string{"a.go": "abc"}},
		{"more than once", map[string]string{"a.go": "ab ab ab"},
			`{"path":"a.go","old_str":"ab","new_str":"cd"}`, "error: edit a.go: old_str occurs 3 times", true, map[string]string{"a.go": "ab ab ab"}},
		{"missing file", nil,
			`{"path":"nope.go","old_str":"a","new_str":"b"}`, "error: edit nope.go: stat", true, nil},
		{"create with parents", nil,
			`{"path":"pkg/sub/new.go","old_str":"","new_str":"package sub\n"}`, "created pkg/sub/new.go", false, map[string]string{"pkg/sub/new.go": "package sub\n"}},
		{"create over an existing file", map[string]string{"a.go": "abc"},
			`{"path":"a.go","old_str":"","new_str":"new"}`, "error: edit a.go: the file exists", true, map[string]string{"a.go": "abc"}},
		{"empty path", nil, `{"path":"","old_str":"","new_str":"x"}`, "error: edit: the argument \"path\" is empty", true, nil},
		{"missing new_str", map[string]string{"a.go": "abc"},
			`{"path":"a.go","old_str":"abc"}`, "error: edit: the argument \"new_str\" (a string) is required", true, map[string]string{"a.go": "abc"}},
		{"a number for a string", nil, `{"path":1,"old_str":"","new_str":"x"}`, "error: edit: the argument \"path\"", true, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for p, c := range tc.files {
				require.NoError(t, os.WriteFile(filepath.Join(dir, p), []byte(c), 0o600))
			}
			tl := &tools{workdir: dir, commandTimeout: time.Minute, maxOutput: 1024}
			res := tl.call(context.Background(), "edit", json.RawMessage(strconvQuote(tc.args)))
			assert.True(t, strings.HasPrefix(res.Output, tc.wantOut), res.Output)
			assert.Equal(t, tc.isErr, res.Error != "", res.Error)
			for p, c := range tc.after {
				b, err := os.ReadFile(filepath.Join(dir, p))
				require.NoError(t, err)
				assert.Equal(t, c, string(b))
			}
			if tc.files != nil && !tc.isErr {
				st, err := os.Stat(filepath.Join(dir, "a.go"))
				require.NoError(t, err)
				assert.Equal(t, os.FileMode(0o600), st.Mode().Perm(), "an edit keeps the mode")
			}
		})
	}
}

// strconvQuote gives args as the wire carries them: a JSON string.
func strconvQuote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

func TestDecodeArgs(t *testing.T) {
	cases := []struct {
		raw   string
		want  map[string]any
		isErr bool
	}{
		{`"{\"command\":\"ls\"}"`, map[string]any{"command": "ls"}, false},
		{`{"command":"ls"}`, map[string]any{"command": "ls"}, false}, // an object given directly
		{`""`, map[string]any{}, false},
		{`"  "`, map[string]any{}, false},
		{`null`, map[string]any{}, false},
		{``, map[string]any{}, false},
		{`"{not json"`, nil, true},
		{`"[1,2]"`, nil, true},
		{`"\"ls\""`, nil, true},
		{`42`, nil, true},
	}
	for _, tc := range cases {
		got, err := decodeArgs(json.RawMessage(tc.raw))
		if tc.isErr {
			assert.Error(t, err, tc.raw)
			continue
		}
		require.NoError(t, err, tc.raw)
		assert.Equal(t, tc.want, got, tc.raw)
	}
}

func TestBash(t *testing.T) {
	cases := []struct {
		name     string
		cmd      string
		timeout  time.Duration
		out      string // the whole result
		exit     int
		timedOut bool
		maxDur   time.Duration
	}{
		{"stdout and stderr combined, in order", "echo a; echo b >&2; echo c", time.Minute, "a\nb\nc\n[exit code 0]", 0, false, 0},
		{"exit code", "echo no; exit 3", time.Minute, "no\n[exit code 3]", 3, false, 0},
		{"no output", "true", time.Minute, "[exit code 0]", 0, false, 0},
		{"no trailing newline", "printf x", time.Minute, "x\n[exit code 0]", 0, false, 0},
		{"stdin is empty", "cat; echo read", time.Minute, "read\n[exit code 0]", 0, false, 5 * time.Second},
		{"runs in the workdir", "basename \"$PWD\"", time.Minute, "work\n[exit code 0]", 0, false, 0},
		{"a signal reads as 128+n", "kill -TERM $$", time.Minute, "[exit code 143]", 143, false, 0},
		{"a syntax error is an exit code", "if then", time.Minute, "", 2, false, 0},
		{"killed at the timeout, children too", "sleep 30 & sleep 30; echo never", 200 * time.Millisecond,
			"[killed: the command ran past its 200ms timeout]", -1, true, 5 * time.Second},
		{"a background process does not hold the call", "sleep 5 & echo started", time.Minute,
			"started\n[exit code 0]", 0, false, 4 * time.Second},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "work")
			require.NoError(t, os.Mkdir(dir, 0o755))
			tl := &tools{workdir: dir, commandTimeout: tc.timeout, maxOutput: 1024}
			start := time.Now()
			res := tl.call(context.Background(), "bash", json.RawMessage(strconvQuote(`{"command":`+strconvQuote(tc.cmd)+`}`)))
			if tc.maxDur > 0 {
				assert.Less(t, time.Since(start), tc.maxDur)
			}
			if tc.out != "" {
				assert.Equal(t, tc.out, res.Output)
			}
			assert.Equal(t, tc.timedOut, res.TimedOut)
			if tc.timedOut {
				assert.Nil(t, res.ExitCode)
			} else {
				require.NotNil(t, res.ExitCode, res.Output)
				assert.Equal(t, tc.exit, *res.ExitCode)
			}
			assert.Empty(t, res.Error)
		})
	}
}

// At the timeout the whole process group goes, not only the shell.
func TestBashKillsTheGroup(t *testing.T) {
	dir := t.TempDir()
	tl := &tools{workdir: dir, commandTimeout: 300 * time.Millisecond, maxOutput: 1024}
	res := tl.bash(context.Background(), "sleep 30 & echo $! > pid; wait")
	require.True(t, res.TimedOut, res.Output)
	b, err := os.ReadFile(filepath.Join(dir, "pid"))
	require.NoError(t, err)
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	require.NoError(t, err)
	assert.Eventually(t, func() bool {
		// Reaped by init once killed; until then a zombie, which /proc
		// shows as state Z.
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		return err != nil || strings.Contains(string(st), ") Z ")
	}, 5*time.Second, 20*time.Millisecond)
}

func TestCommandEnv(t *testing.T) {
	assert.Equal(t, []string{"PATH=/bin", "HOME=/root", "XKILN_AGENT_A=1"},
		commandEnv([]string{"PATH=/bin", "KILN_AGENT_API_KEY=k", "HOME=/root", "KILN_AGENT_SESSION=s", "XKILN_AGENT_A=1"}))
	tl := &tools{workdir: t.TempDir(), commandTimeout: time.Minute, maxOutput: 1024, env: []string{"A=1"}}
	assert.Equal(t, "A=1\n[exit code 0]", tl.bash(context.Background(), "env | grep -v '^PWD=' | grep -v '^SHLVL=' | grep -v '^_='").Output)
}

func TestCapWriter(t *testing.T) {
	cases := []struct {
		name      string
		limit     int
		writes    []string
		want      string
		truncated bool
	}{
		{"under", 10, []string{"abc", "de"}, "abcde", false},
		{"exactly at the limit", 10, []string{"0123456789"}, "0123456789", false},
		{"head and tail", 10, []string{"0123456789", "ABCDEFGHIJ"},
			"01234\n[... 10 bytes of output omitted: a tool result keeps at most 10 bytes, its head and its tail ...]\nFGHIJ", true},
		{"many small writes", 4, strings.Split("abcdefghijklmnop", ""),
			"ab\n[... 12 bytes of output omitted: a tool result keeps at most 4 bytes, its head and its tail ...]\nop", true},
		{"odd limit", 5, []string{"abcdefgh"},
			"abc\n[... 3 bytes of output omitted: a tool result keeps at most 5 bytes, its head and its tail ...]\ngh", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := newCapWriter(tc.limit)
			for _, s := range tc.writes {
				n, err := w.Write([]byte(s))
				require.NoError(t, err)
				require.Equal(t, len(s), n)
			}
			got, tr := w.String()
			assert.Equal(t, tc.want, got)
			assert.Equal(t, tc.truncated, tr)
		})
	}
}
