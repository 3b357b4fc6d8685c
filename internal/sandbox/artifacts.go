package sandbox

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// ArtifactSink stores one sandbox's artifacts under slash-separated names
// ("commands.jsonl", "files/trajectory.jsonl"). Create must fail if name
// already exists: artifacts are never overwritten.
type ArtifactSink interface {
	Create(name string) (io.WriteCloser, error)
}

// DirSink is an ArtifactSink writing files under a host directory, which it
// creates as needed; each file is created exclusively.
type DirSink string

// Create creates dir/name exclusively.
func (d DirSink) Create(name string) (io.WriteCloser, error) {
	p := filepath.Join(string(d), filepath.FromSlash(name))
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return nil, fmt.Errorf("artifact %q: %w", name, err)
	}
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return nil, fmt.Errorf("artifact %q: %w", name, err)
	}
	return f, nil
}

func putArtifact(sink ArtifactSink, name string, data []byte) error {
	w, err := sink.Create(name)
	if err != nil {
		return err
	}
	if _, err := io.Copy(w, bytes.NewReader(data)); err != nil {
		w.Close()
		return fmt.Errorf("artifact %q: %w", name, err)
	}
	if err := w.Close(); err != nil {
		return fmt.Errorf("artifact %q: %w", name, err)
	}
	return nil
}

// SandboxRecord is sandbox.json: which sandbox this is, written at boot so an
// interrupted run can find and kill exactly its own sandboxes.
type SandboxRecord struct {
	ID       string    `json:"sandbox_id"`
	Provider string    `json:"provider"`
	Rootfs   string    `json:"rootfs"`
	Host     string    `json:"host"`
	PID      int       `json:"pid"` // the sandbox's outermost process (bwrap), 0 for local
	StateDir string    `json:"state_dir,omitempty"`
	Created  time.Time `json:"created"`
}

// CommandRecord is one line of commands.jsonl.
type CommandRecord struct {
	Seq             int       `json:"seq"`
	Command         string    `json:"command"`
	Argv            []string  `json:"argv,omitempty"`
	User            string    `json:"user"`
	Dir             string    `json:"dir,omitempty"`
	ExitCode        int       `json:"exit_code"`
	Stdout          string    `json:"stdout"`
	Stderr          string    `json:"stderr"`
	StdoutTruncated bool      `json:"stdout_truncated,omitempty"`
	StderrTruncated bool      `json:"stderr_truncated,omitempty"`
	TimedOut        bool      `json:"timed_out,omitempty"`
	OOMKilled       bool      `json:"oom_killed,omitempty"`
	PidsLimited     bool      `json:"pids_limited,omitempty"`
	Started         time.Time `json:"started"`
	DurationMs      float64   `json:"duration_ms"`
	// CPUMs is the command's CPU time, with the processes it waited for.
	CPUMs float64 `json:"cpu_ms,omitempty"`
	Error string  `json:"error,omitempty"`
}

// recorder appends command records to a host file as they happen, so a
// sandbox's memory does not grow with its history; Close copies the file to
// the sink.
type recorder struct {
	mu   sync.Mutex
	f    *os.File
	seq  int
	werr error
}

func newRecorder(path string) (*recorder, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	return &recorder{f: f}, nil
}

func (r *recorder) add(cmd Cmd, argv []string, started time.Time, res Result, execErr error) {
	rec := CommandRecord{
		Command: cmd.String(), User: cmd.User, Dir: cmd.Dir,
		ExitCode: res.ExitCode, Stdout: string(res.Stdout), Stderr: string(res.Stderr),
		StdoutTruncated: res.StdoutTruncated, StderrTruncated: res.StderrTruncated,
		TimedOut: res.TimedOut, OOMKilled: res.OOMKilled, PidsLimited: res.PidsLimited,
		Started: started.UTC(), DurationMs: float64(res.Duration.Microseconds()) / 1000,
		CPUMs: float64(res.CPU.Microseconds()) / 1000,
	}
	if cmd.Shell == "" {
		rec.Argv = argv
	}
	if rec.User == "" {
		rec.User = Root
	}
	if execErr != nil {
		rec.Error = execErr.Error()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seq++
	rec.Seq = r.seq
	line, _ := json.Marshal(rec)
	if _, err := r.f.Write(append(line, '\n')); err != nil && r.werr == nil {
		r.werr = err
	}
}

// save copies the records to the sink as commands.jsonl.
func (r *recorder) save(sink ArtifactSink) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.werr != nil {
		return fmt.Errorf("record commands: %w", r.werr)
	}
	if _, err := r.f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	w, err := sink.Create("commands.jsonl")
	if err != nil {
		return err
	}
	if _, err := io.Copy(w, r.f); err != nil {
		w.Close()
		return fmt.Errorf("artifact %q: %w", "commands.jsonl", err)
	}
	return w.Close()
}

func (r *recorder) close() error { return r.f.Close() }
