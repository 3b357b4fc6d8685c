package shellagent_test

import (
	"bytes"
	"debug/elf"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
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
		{"another scheme", []string{"--base-url", "ftp://x/v1", "--model", "m", "--task-file", task}, nil, 2, "only http:// and https://"},
		{"bad proxy", base, map[string]string{"KILN_AGENT_PROXY": "not a url"}, 2, "KILN_AGENT_PROXY"},
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
// be static: built as make build builds it (CGO_ENABLED=0), the ELF has no
// interpreter and needs no library, though it imports net/http, and it
// runs.
func TestStaticBinary(t *testing.T) {
	out := buildAgent(t, t.TempDir())
	require.NoError(t, shellagent.CheckStatic(out))
	f, err := elf.Open(out)
	require.NoError(t, err)
	defer f.Close()
	for _, p := range f.Progs {
		assert.NotEqual(t, elf.PT_INTERP, p.Type, "the binary has an interpreter (dynamically linked)")
	}
	libs, err := f.ImportedLibraries()
	require.NoError(t, err)
	assert.Empty(t, libs)

	var stdout bytes.Buffer
	run := exec.Command(out, "--help")
	run.Stdout = &stdout
	require.NoError(t, run.Run())
	assert.Equal(t, shellagent.Manual, stdout.String())
}

// CheckStatic refuses a dynamically linked binary (a program importing net
// built with cgo, where a C compiler is installed) and what is not an ELF,
// with the way to rebuild it.
func TestCheckStatic(t *testing.T) {
	dir := t.TempDir()
	text := filepath.Join(dir, "script")
	require.NoError(t, os.WriteFile(text, []byte("#!/bin/sh\necho hi\n"), 0o755))
	for _, p := range []string{text, filepath.Join(dir, "missing")} {
		err := shellagent.CheckStatic(p)
		require.Error(t, err, p)
		assert.Contains(t, err.Error(), "rebuild it with CGO_ENABLED=0 go build ./cmd/kiln-agent (make build does)")
	}

	goBin := goCmd()
	cc, _ := exec.Command(goBin, "env", "CC").Output()
	if _, err := exec.LookPath(strings.TrimSpace(string(cc))); err != nil || strings.TrimSpace(string(cc)) == "" {
		t.Skipf("no C compiler (%q) to build a dynamic binary with", strings.TrimSpace(string(cc)))
	}
	src := filepath.Join(dir, "dyn")
	require.NoError(t, os.MkdirAll(src, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(src, "go.mod"), []byte("module dyn\n\ngo 1.21\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(src, "main.go"), []byte(`package main

import (
	"fmt"
	"net"
)

func main() { fmt.Println(net.LookupHost("localhost")) }
`), 0o644))
	bin := filepath.Join(dir, "dyn-bin")
	cmd := exec.Command(goBin, "build", "-o", bin, ".")
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1", "GOFLAGS=")
	b, err := cmd.CombinedOutput()
	require.NoError(t, err, string(b))
	err = shellagent.CheckStatic(bin)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "dynamically linked")
	assert.Contains(t, err.Error(), "libc")
	assert.Contains(t, err.Error(), "rebuild it with CGO_ENABLED=0 go build ./cmd/kiln-agent (make build does)")
}

// The static binary speaks https too (pure-Go TLS; the CA from
// SSL_CERT_FILE), and ignores HTTP_PROXY: the proxy named there is not
// listening, and the call still goes straight to the server.
func TestStaticBinaryOverHTTPS(t *testing.T) {
	dir := t.TempDir()
	out := buildAgent(t, dir)
	f := &fake{replies: []fakeReply{{200, completion("secure")}}}
	srv := httptest.NewTLSServer(f)
	defer srv.Close()
	ca := filepath.Join(dir, "ca.pem")
	require.NoError(t, os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o644))
	task := filepath.Join(dir, "task.md")
	require.NoError(t, os.WriteFile(task, []byte("be secure"), 0o644))
	dead := "http://127.0.0.1:1"
	cmd := exec.Command(out, "--base-url", srv.URL+"/v1", "--model", "m", "--task-file", task, "--workdir", dir, "--timeout", "30s")
	cmd.Env = []string{"SSL_CERT_FILE=" + ca, "KILN_AGENT_API_KEY=tls-1", "HTTPS_PROXY=" + dead, "HTTP_PROXY=" + dead, "https_proxy=" + dead}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Run(), stderr.String())
	assert.Equal(t, "secure\n", stdout.String())
	require.Equal(t, 1, f.requests())
	assert.Equal(t, "Bearer tls-1", f.headers[0].Get("Authorization"))

	// Without the CA the certificate is refused: a connection error, exit 1.
	cmd = exec.Command(out, "--base-url", srv.URL+"/v1", "--model", "m", "--task-file", task, "--workdir", dir, "--timeout", "30s")
	cmd.Env = []string{"SSL_CERT_FILE=" + filepath.Join(dir, "none.pem"), "SSL_CERT_DIR=" + t.TempDir()}
	stderr.Reset()
	cmd.Stderr = &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee)
	assert.Equal(t, shellagent.ExitError, ee.ExitCode())
	assert.Contains(t, stderr.String(), "certificate")
}

// KILN_AGENT_PROXY (Config.Proxy) is used on purpose, for every call, even
// to a loopback adapter.
func TestProxySetOnPurpose(t *testing.T) {
	var proxied []string
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		proxied = append(proxied, r.URL.String())
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(completion("via proxy")))
	}))
	defer proxy.Close()
	dir := t.TempDir()
	task := filepath.Join(dir, "task.md")
	require.NoError(t, os.WriteFile(task, []byte("go"), 0o644))
	env := map[string]string{"KILN_AGENT_PROXY": proxy.URL}
	var stdout, stderr bytes.Buffer
	code := shellagent.Main([]string{"--base-url", "http://127.0.0.1:1/v1", "--model", "m", "--task-file", task, "--workdir", dir},
		func(k string) string { return env[k] }, &stdout, &stderr)
	require.Equal(t, shellagent.ExitFinal, code, stderr.String())
	assert.Equal(t, "via proxy\n", stdout.String())
	assert.Equal(t, []string{"http://127.0.0.1:1/v1/chat/completions"}, proxied)
}
