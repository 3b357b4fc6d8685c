package sandboxinit

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Main runs the helper with its command line (without the program name) and
// returns the process exit code. Modes:
//
//	init [--agent NAME] [--listen PORT] [--cgroup v1:N|v2:1]
//	                      the sandbox's long-lived init: fd 3 is the listening
//	                      socket it serves host requests on; with --cgroup,
//	                      fds 4..4+N-1 are the cgroup v1 tasks files or the v2
//	                      cgroup directory its commands are started in
//	child OP -- ARGS...   a file operation as the requesting user (init only)
func Main(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, "kiln-sandbox-helper: runs inside kiln bwrap sandboxes; not for direct use (modes: init, child)")
		return 2
	}
	switch args[0] {
	case "init":
		return initMain(args[1:], stdout, stderr)
	case "child":
		return childMain(args[1:], stderr)
	}
	fmt.Fprintf(stderr, "kiln-sandbox-helper: unknown mode %q (want init or child)\n", args[0])
	return 2
}

func initMain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("init", flag.ContinueOnError)
	fs.SetOutput(stderr)
	agent := fs.String("agent", "", "unprivileged user to create if missing")
	listen := fs.Int("listen", 0, "loopback port forwarded to the endpoint socket (0: none)")
	cgroup := fs.String("cgroup", "", "v1:N (tasks files) or v2:1 (cgroup directory) at fd 4...")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	// Not dumpable: root in the sandbox cannot open init's descriptors (the
	// cgroup handles) through /proc/PID/fd without CAP_SYS_PTRACE.
	_ = prctlNotDumpable()
	sp, err := newSpawner(*cgroup)
	if err != nil {
		fmt.Fprintf(stderr, "kiln-sandbox-helper: cgroup: %v\n", err)
		return 1
	}
	if *agent != "" {
		if err := ensureUser(*agent); err != nil {
			fmt.Fprintf(stderr, "kiln-sandbox-helper: create user %q: %v\n", *agent, err)
			return 1
		}
	}
	syscall.CloseOnExec(CtlFD)
	if *listen > 0 {
		tcp, err := listenLoopback(*listen)
		if err != nil {
			fmt.Fprintf(stderr, "kiln-sandbox-helper: listen on 127.0.0.1:%d: %v\n", *listen, err)
			return 1
		}
		go acceptLoop(tcp, forwardToEndpoint)
	}
	fmt.Fprintln(stdout, ReadyLine)
	acceptLoop(CtlFD, func(c *os.File) { serveConn(c, sp) })
	return 1
}

// serveConn answers one request. The host keeps the connection open while it
// waits; if it goes away first (its context was cancelled), the command is
// killed.
func serveConn(conn *os.File, sp *spawner) {
	defer conn.Close()
	br := bufio.NewReaderSize(conn, 64<<10)
	line, err := br.ReadBytes('\n')
	if err != nil {
		return
	}
	var req Request
	if err := json.Unmarshal(line, &req); err != nil {
		_ = json.NewEncoder(conn).Encode(Response{Error: fmt.Sprintf("bad request: %v", err)})
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		_, _ = br.ReadByte() // returns when the host closes its end
		cancel()
	}()
	var resp Response
	switch req.Op {
	case OpReadFile:
		resp = readFile(&req)
	case OpKill:
		resp = killUser(req.User)
	default:
		resp = run(ctx, sp, &req)
	}
	_ = json.NewEncoder(conn).Encode(resp)
}

// readFile answers OpReadFile from init itself: reading as root needs no
// process of its own. Only regular files are read, so a FIFO or a device
// a command put at the path cannot block or flood init.
func readFile(req *Request) Response {
	if len(req.Argv) != 1 {
		return Response{Error: "readfile: want PATH"}
	}
	if req.User != "" && req.User != "root" {
		return Response{Error: fmt.Sprintf("readfile %q: as root only, not as %q", req.Argv[0], req.User)}
	}
	start := time.Now()
	fail := func(err error) Response {
		msg := err.Error() + "\n"
		return Response{ExitCode: 1, Stderr: []byte(msg), StderrBytes: int64(len(msg)), DurationNs: int64(time.Since(start))}
	}
	f, err := os.OpenFile(req.Argv[0], os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if err != nil {
		return fail(err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fail(err)
	}
	if !fi.Mode().IsRegular() {
		return fail(fmt.Errorf("%s: not a regular file (%s)", req.Argv[0], fi.Mode().Type()))
	}
	// One byte past the limit tells truncation; the rest of a huge (or
	// sparse) file is not read.
	out := NewCappedBuffer(req.OutputLimit)
	if _, err := io.Copy(out, io.LimitReader(f, int64(max(req.OutputLimit, 0))+1)); err != nil {
		return fail(err)
	}
	return Response{Stdout: out.Bytes(), StdoutBytes: max(out.Total(), fi.Size()), StdoutTruncated: out.Truncated(),
		DurationNs: int64(time.Since(start))}
}

// killUser answers OpKill: SIGKILL to every process whose real, effective
// or saved uid is name's (the processes "kill -KILL -1" run as that user
// reaches), repeated until a scan of /proc finds none alive, since a fork
// bomb keeps forking while it is being killed. Root is refused: init and
// the sandbox's own processes are root's.
func killUser(name string) Response {
	u, err := lookupUser(name)
	if err != nil {
		return Response{Error: err.Error()}
	}
	if u.uid == 0 {
		return Response{Error: fmt.Sprintf("kill: refusing to kill the processes of %q (uid 0)", u.name)}
	}
	start := time.Now()
	if !killMatching(200, func(pid int) bool { return uidOf(pid, u.uid) }) {
		return Response{Error: fmt.Sprintf("kill: processes of %q still running after 200 rounds of SIGKILL", u.name)}
	}
	return Response{DurationNs: int64(time.Since(start))}
}

// killMatching sends SIGKILL to every process but init itself that match
// selects, and scans /proc again, 5 ms later, until a scan finds none (a
// fork bomb keeps forking while it is being killed), at most rounds
// scans; it reports whether the last scan found none.
func killMatching(rounds int, match func(pid int) bool) bool {
	for range rounds {
		found := false
		ents, _ := os.ReadDir("/proc")
		for _, e := range ents {
			pid, err := strconv.Atoi(e.Name())
			if err != nil || pid == os.Getpid() {
				continue
			}
			if match(pid) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
				found = true
			}
		}
		if !found {
			return true
		}
		time.Sleep(5 * time.Millisecond)
	}
	return false
}

// uidOf reports whether pid is alive (not a zombie) and has uid as its
// real, effective or saved uid, from /proc/PID/status.
func uidOf(pid int, uid uint32) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return false
	}
	want := strconv.FormatUint(uint64(uid), 10)
	match := false
	for line := range bytes.Lines(b) {
		if rest, ok := bytes.CutPrefix(line, []byte("State:")); ok {
			if f := bytes.Fields(rest); len(f) > 0 && (f[0][0] == 'Z' || f[0][0] == 'X') {
				return false
			}
		}
		if rest, ok := bytes.CutPrefix(line, []byte("Uid:")); ok {
			f := strings.Fields(string(rest))
			for _, id := range f[:min(3, len(f))] {
				match = match || id == want
			}
			return match // Uid: follows State: in the file
		}
	}
	return false
}

// run starts the command in its own session (so the whole tree it creates
// can be killed on timeout) as the requested user, inside the sandbox's
// cgroup, and waits for it.
func run(ctx context.Context, sp *spawner, req *Request) Response {
	u, err := lookupUser(req.User)
	if err != nil {
		return Response{Error: err.Error()}
	}
	if len(req.Argv) == 0 {
		return Response{Error: "empty argv"}
	}
	dir := req.Dir
	if dir == "" {
		dir = "/"
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return Response{Error: fmt.Sprintf("working directory %q: not a directory", dir)}
	}
	env := mergeEnv(u.env(), req.Env)
	var cmd *exec.Cmd
	switch req.Op {
	case OpExec:
		path, ok := lookPath(req.Argv[0], env)
		if !ok {
			msg := fmt.Sprintf("kiln-sandbox: %s: command not found\n", req.Argv[0])
			return Response{ExitCode: 127, Stderr: []byte(msg), StderrBytes: int64(len(msg))}
		}
		cmd = &exec.Cmd{Path: path, Args: req.Argv}
	default:
		cmd = exec.Command(HelperPath, append([]string{"child", req.Op, "--"}, req.Argv...)...)
	}
	cmd.Env = env
	cmd.Dir = dir
	cmd.Stdin = bytes.NewReader(req.Stdin)
	stdout, stderr := NewCappedBuffer(req.OutputLimit), NewCappedBuffer(req.OutputLimit)
	cmd.Stdout, cmd.Stderr = stdout, stderr
	cmd.WaitDelay = 500 * time.Millisecond
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Setsid:     true,
		Credential: &syscall.Credential{Uid: u.uid, Gid: u.gid, Groups: u.groups},
	}
	start := time.Now()
	if err := sp.start(cmd); err != nil {
		var errno syscall.Errno
		if errors.As(err, &errno) && (errno == syscall.EACCES || errno == syscall.ENOEXEC || errno == syscall.ENOENT) {
			// Found but not runnable (permissions, bad interpreter): the
			// shell's answer, 126 or 127.
			code := 126
			if errno == syscall.ENOENT {
				code = 127
			}
			msg := fmt.Sprintf("kiln-sandbox: %s: %v\n", req.Argv[0], errno)
			return Response{ExitCode: code, Stderr: []byte(msg), StderrBytes: int64(len(msg))}
		}
		return Response{Error: fmt.Sprintf("start %q as %q in %q: %v", req.Argv[0], u.name, dir, err)}
	}
	pid := cmd.Process.Pid

	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var timeout <-chan time.Time
	if req.TimeoutMs > 0 {
		t := time.NewTimer(time.Duration(req.TimeoutMs) * time.Millisecond)
		defer t.Stop()
		timeout = t.C
	}
	timedOut := false
	select {
	case <-done:
	case <-timeout:
		timedOut = true
		killSession(pid)
		<-done
	case <-ctx.Done():
		killSession(pid)
		<-done
	}
	resp := Response{
		ExitCode:        exitCode(cmd.ProcessState),
		Stdout:          stdout.Bytes(),
		Stderr:          stderr.Bytes(),
		StdoutBytes:     stdout.Total(),
		StderrBytes:     stderr.Total(),
		StdoutTruncated: stdout.Truncated(),
		StderrTruncated: stderr.Truncated(),
		DurationNs:      int64(time.Since(start)),
		CPUNs:           int64(cpuTime(cmd.ProcessState)),
	}
	if timedOut {
		resp.ExitCode, resp.TimedOut = 124, true
	}
	return resp
}

// cpuTime is a finished process's user + system CPU time, its waited-for
// descendants' included (0 if unknown).
func cpuTime(ps *os.ProcessState) time.Duration {
	if ps == nil {
		return 0
	}
	return ps.UserTime() + ps.SystemTime()
}

// exitCode is the shell convention: the exit status, or 128+signal.
func exitCode(ps *os.ProcessState) int {
	if ps == nil {
		return -1
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}

// killSession kills the command's process group and every process still in
// its session, repeating until none is left (a fork bomb keeps forking while
// it is being killed). Processes that started a session of their own (setsid,
// as exec_and_wait's detached commands do) survive until the sandbox closes.
func killSession(sid int) {
	_ = syscall.Kill(-sid, syscall.SIGKILL)
	killMatching(100, func(pid int) bool {
		s, pg, ok := sessionOf(pid)
		return ok && (s == sid || pg == sid)
	})
}

// sessionOf reads the session and process group of pid from /proc/PID/stat.
func sessionOf(pid int) (sid, pgid int, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, false
	}
	// Fields after the command name (which may contain spaces): state ppid pgrp session ...
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 4 {
		return 0, 0, false
	}
	pg, err1 := strconv.Atoi(f[2])
	s, err2 := strconv.Atoi(f[3])
	if f[0] == "Z" || err1 != nil || err2 != nil {
		return 0, 0, false
	}
	return s, pg, true
}

func mergeEnv(base, overlay []string) []string {
	idx := map[string]int{}
	out := make([]string, 0, len(base)+len(overlay))
	for _, kv := range append(append([]string{}, base...), overlay...) {
		k, _, _ := strings.Cut(kv, "=")
		if i, ok := idx[k]; ok {
			out[i] = kv
			continue
		}
		idx[k] = len(out)
		out = append(out, kv)
	}
	return out
}

// childMain performs a file operation; init starts it as the requesting
// user, so permissions and ownership are that user's.
func childMain(args []string, stderr io.Writer) int {
	if len(args) < 2 || args[1] != "--" {
		fmt.Fprintln(stderr, "kiln-sandbox-helper child: usage: child OP -- ARGS...")
		return 2
	}
	op, argv := args[0], args[2:]
	switch op {
	case OpWriteFile:
		if len(argv) != 2 {
			fmt.Fprintln(stderr, "writefile: want PATH MODE")
			return 2
		}
		if err := writeFile(argv[0], argv[1]); err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		return 0
	}
	fmt.Fprintf(stderr, "kiln-sandbox-helper child: unknown op %q\n", op)
	return 2
}

// lookPath finds argv0 in the command's PATH, like a shell: names with a
// slash are taken as they are; otherwise the first regular file with an
// execute bit wins.
func lookPath(argv0 string, env []string) (string, bool) {
	if strings.Contains(argv0, "/") {
		return argv0, true
	}
	path := ""
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, argv0)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, true
		}
	}
	return "", false
}

// writeFile writes stdin to path with mode, creating missing parents; it runs
// as the target user, so the file and new parents are theirs.
func writeFile(path, modeText string) error {
	mode, err := strconv.ParseUint(modeText, 8, 32)
	if err != nil {
		return fmt.Errorf("writefile %q: bad mode %q", path, modeText)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, os.FileMode(mode))
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, os.Stdin); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(os.FileMode(mode)); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
