package train

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"
)

// startForkserver runs l.Plan on the warm trainer listening at l.Socket
// (python -m kiln_gpu.forkserver; docs/train-stage.md §8.1): one
// connection per run, a JSON request line with the run's stdin, stdout
// and stderr attached, {"pid"} when its child is started and {"exit"} when
// it is done. Closing the connection (ctx cancelled) makes the server kill
// the run's process group. The child gets kiln-train's environment plus
// l.Env, and runs in l.Dir; the code it runs is the code the server
// imported when it started.
func startForkserver(ctx context.Context, l Launch) (*trainerProc, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", l.Socket)
	if err != nil {
		return nil, fmt.Errorf("--trainer-socket %q: %w (start it with python -m kiln_gpu.forkserver --socket %s, or leave the flag out to start a trainer process)", l.Socket, err, l.Socket)
	}
	conn := c.(*net.UnixConn)
	fail := func(err error) (*trainerProc, error) {
		conn.Close()
		return nil, err
	}
	env := map[string]string{"PYTHONUNBUFFERED": "1"}
	for _, kv := range append(os.Environ(), l.Env...) {
		if k, v, ok := strings.Cut(kv, "="); ok {
			env[k] = v
		}
	}
	req, err := json.Marshal(map[string]any{"plan": l.Plan, "cwd": l.Dir, "env": env})
	if err != nil {
		return fail(err)
	}
	stdin, err := os.Open(os.DevNull)
	if err != nil {
		return fail(err)
	}
	defer stdin.Close()
	outR, outW, err := os.Pipe()
	if err != nil {
		return fail(err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return fail(err)
	}
	rights := syscall.UnixRights(int(stdin.Fd()), int(outW.Fd()), int(errW.Fd()))
	_, _, err = conn.WriteMsgUnix(append(req, '\n'), rights, nil)
	// the server holds its own copies now; ours would keep the pipes open
	// after the run ended
	outW.Close()
	errW.Close()
	closeReaders := func() { outR.Close(); errR.Close() }
	if err != nil {
		closeReaders()
		return fail(fmt.Errorf("--trainer-socket %q: sending the run: %w", l.Socket, err))
	}
	replies := bufio.NewScanner(conn)
	var first struct {
		PID   int    `json:"pid"`
		Error string `json:"error"`
	}
	if !replies.Scan() || json.Unmarshal(replies.Bytes(), &first) != nil || first.PID == 0 {
		closeReaders()
		if first.Error != "" {
			return fail(fmt.Errorf("--trainer-socket %q refused the run: %s", l.Socket, first.Error))
		}
		return fail(fmt.Errorf("--trainer-socket %q: no pid in its answer %q (%v): is it python -m kiln_gpu.forkserver?", l.Socket, replies.Text(), replies.Err()))
	}
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	wait := func() error {
		defer stop()
		defer conn.Close()
		var last struct {
			Exit *int `json:"exit"`
		}
		if !replies.Scan() || json.Unmarshal(replies.Bytes(), &last) != nil || last.Exit == nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("the warm trainer at %q (pid %d's server) closed the connection without an exit status: did it stop? (%v)", l.Socket, first.PID, replies.Err())
		}
		switch {
		case *last.Exit < 0:
			return fmt.Errorf("pid %d on the warm trainer %q: killed by signal %d", first.PID, l.Socket, -*last.Exit)
		case *last.Exit > 0:
			return fmt.Errorf("pid %d on the warm trainer %q: exit status %d", first.PID, l.Socket, *last.Exit)
		}
		return nil
	}
	return &trainerProc{stdout: outR, stderr: errR, wait: func() error {
		defer closeReaders()
		return wait()
	}}, nil
}
