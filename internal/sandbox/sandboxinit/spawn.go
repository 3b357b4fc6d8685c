package sandboxinit

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
)

// spawner starts commands inside the sandbox's cgroup while init itself stays
// outside it (so neither the OOM killer nor the pids limit can reach init).
//
// cgroup v1: one OS thread, locked, is moved into the cgroup by writing its
// thread id to the tasks files; every command is forked from that thread, and
// a child is born in its parent thread's cgroups. Go creates new runtime
// threads from a template thread when the current one is locked, so no
// runtime thread ends up inside. cgroup v2: commands are cloned straight into
// the cgroup directory (clone3 CLONE_INTO_CGROUP).
type spawner struct {
	reqs     chan spawnReq
	cgroupFD int // v2 directory, -1 otherwise
}

type spawnReq struct {
	cmd  *exec.Cmd
	done chan error
}

// newSpawner parses --cgroup (v1:N, v2:1 or "") and sets up the spawner.
func newSpawner(spec string) (*spawner, error) {
	sp := &spawner{reqs: make(chan spawnReq), cgroupFD: -1}
	var tasks []*os.File
	if spec != "" {
		mode, nText, ok := strings.Cut(spec, ":")
		n, err := strconv.Atoi(nText)
		if !ok || err != nil || n < 1 || (mode != "v1" && mode != "v2") {
			return nil, fmt.Errorf("bad --cgroup %q", spec)
		}
		for i := range n {
			fd := CtlFD + 1 + i
			syscall.CloseOnExec(fd)
			if mode == "v2" {
				sp.cgroupFD = fd
			} else {
				tasks = append(tasks, os.NewFile(uintptr(fd), "tasks"))
			}
		}
	}
	go sp.loop(tasks)
	return sp, nil
}

// loop runs on its own locked thread for the life of init. Moving the thread
// takes milliseconds (a cgroup attach waits for an RCU grace period), so it
// happens while init already reports ready; requests queue until it is done,
// and fail if it failed.
func (sp *spawner) loop(tasks []*os.File) {
	runtime.LockOSThread() // never unlocked: the thread is the cgroup's door
	tid := strconv.Itoa(syscall.Gettid())
	var moveErr error
	for _, f := range tasks {
		if _, err := f.WriteString(tid); err != nil && moveErr == nil {
			moveErr = fmt.Errorf("move spawner thread into the sandbox cgroup: %w", err)
		}
		f.Close()
	}
	for r := range sp.reqs {
		if moveErr != nil {
			r.done <- moveErr
			continue
		}
		if sp.cgroupFD >= 0 {
			r.cmd.SysProcAttr.UseCgroupFD = true
			r.cmd.SysProcAttr.CgroupFD = sp.cgroupFD
		}
		r.done <- r.cmd.Start()
	}
}

// start starts cmd (which must have SysProcAttr set) inside the cgroup.
func (sp *spawner) start(cmd *exec.Cmd) error {
	done := make(chan error, 1)
	sp.reqs <- spawnReq{cmd: cmd, done: done}
	return <-done
}

func prctlNotDumpable() error {
	_, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, syscall.PR_SET_DUMPABLE, 0, 0)
	if errno != 0 {
		return errno
	}
	return nil
}
