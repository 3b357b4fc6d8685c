package shellagent_test

import (
	"bytes"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/internal/agent/shellagent"
)

// Bad usage is exit 2 with a message naming the problem; --help is the
// manual on stdout.
func TestMainUsage(t *testing.T) {
	dir := t.TempDir()
	task := filepath.Join(dir, "task.md")
	require.NoError(t, os.WriteFile(task, []byte("do it"), 0o644))
	empty := filepath.Join(dir, "empty.md")
	require.NoError(t, os.WriteFile(empty, []byte(" \n"), 0o644))
	base := []string{"--base-url", "http://127.0.0.1:1/v1", "--model", "m", "--task-file", task}
	cases := []struct {
		name string
		args []string
		env  map[string]string
		code int
		want string // in stderr (or stdout for --help)
	}{
		{"help", []string{"--help"}, nil, 0, "kiln-agent --base-url URL --model NAME --task-file FILE"},
		{"-h", []string{"-h"}, nil, 0, "Exit status:"},
		{"no base url", []string{"--model", "m", "--task-file", task}, nil, 2, "--base-url is required"},
		{"https", []string{"--base-url", "https://x/v1", "--model", "m", "--task-file", task}, nil, 2, "only http://"},
		{"no model", []string{"--base-url", "http://x/v1", "--task-file", task}, nil, 2, "--model is required"},
		{"no task", []string{"--base-url", "http://x/v1", "--model", "m"}, nil, 2, "--task-file is required"},
		{"missing task file", []string{"--base-url", "http://x/v1", "--model", "m", "--task-file", filepath.Join(dir, "no")}, nil, 2, "task file: open"},
		{"empty task file", []string{"--base-url", "http://x/v1", "--model", "m", "--task-file", empty}, nil, 2, "is empty"},
		{"unknown flag", append([]string{"--frobnicate"}, base...), nil, 2, "flag provided but not defined: -frobnicate"},
		{"bad duration", append([]string{"--timeout", "soon"}, base...), nil, 2, "invalid value \"soon\" for flag -timeout"},
		{"bad temperature", append([]string{"--temperature", "hot"}, base...), nil, 2, "-temperature"},
		{"zero turns", append([]string{"--max-turns", "0"}, base...), nil, 2, "--max-turns 0"},
		{"tiny output limit", append([]string{"--max-output-bytes", "10"}, base...), nil, 2, "--max-output-bytes 10"},
		{"negative max tokens", append([]string{"--max-tokens", "-1"}, base...), nil, 2, "--max-tokens -1"},
		{"extra argument", append(base, "extra"), nil, 2, "unexpected arguments"},
		{"workdir missing", append([]string{"--workdir", filepath.Join(dir, "none")}, base...), nil, 2, "workdir:"},
		{"workdir a file", append([]string{"--workdir", task}, base...), nil, 2, "not a directory"},
		{"log unwritable", append([]string{"--log", filepath.Join(task, "log")}, base...), nil, 2, "log:"},
		// The environment's base URL is used: the run gets as far as the
		// connection (nothing listens on port 1) and fails with exit 1.
		{"env base url", []string{"--model", "m", "--task-file", task, "--timeout", "5s"},
			map[string]string{"OPENAI_BASE_URL": "http://127.0.0.1:1/v1"}, 1, "connection refused"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := shellagent.Main(tc.args, func(k string) string { return tc.env[k] }, &stdout, &stderr)
			assert.Equal(t, tc.code, code, stderr.String())
			out := stderr.String()
			if tc.code == 0 {
				out = stdout.String()
				assert.Equal(t, shellagent.Manual, out)
			}
			assert.Contains(t, out, tc.want)
		})
	}
}

// kiln-agent is bind-mounted into images with any libc or none, so it must
// be static however it is built: with the environment's CGO_ENABLED (make
// build's), not only with CGO_ENABLED=0. Importing "net" would break that
// (its cgo resolver links libc), so none of the packages that pull in libc
// may be among its dependencies.
func TestStaticBinary(t *testing.T) {
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(goBin); err != nil {
		goBin = "go"
	}
	deps, err := exec.Command(goBin, "list", "-deps", "github.com/kilnrl/kiln/cmd/kiln-agent").CombinedOutput()
	require.NoError(t, err, string(deps))
	for _, p := range strings.Fields(string(deps)) {
		switch p {
		case "net", "os/user", "runtime/cgo", "crypto/tls", "net/http", "plugin":
			t.Errorf("cmd/kiln-agent depends on %s, which can link the binary against libc", p)
		}
	}
	for _, cgo := range []string{"", "0"} {
		out := filepath.Join(t.TempDir(), "kiln-agent")
		cmd := exec.Command(goBin, "build", "-o", out, "github.com/kilnrl/kiln/cmd/kiln-agent")
		if cgo != "" {
			cmd.Env = append(os.Environ(), "CGO_ENABLED="+cgo)
		}
		b, err := cmd.CombinedOutput()
		require.NoError(t, err, string(b))
		f, err := elf.Open(out)
		require.NoError(t, err)
		for _, p := range f.Progs {
			assert.NotEqual(t, elf.PT_INTERP, p.Type, "CGO_ENABLED=%q: the binary has an interpreter (dynamically linked)", cgo)
		}
		libs, err := f.ImportedLibraries()
		require.NoError(t, err)
		assert.Empty(t, libs, "CGO_ENABLED=%q", cgo)
		f.Close()

		var stdout bytes.Buffer
		run := exec.Command(out, "--help")
		run.Stdout = &stdout
		require.NoError(t, run.Run())
		assert.Equal(t, shellagent.Manual, stdout.String())
	}
}
