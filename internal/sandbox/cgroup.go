package sandbox

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cgroup is a sandbox's cgroup: it holds the sandbox's commands, and only
// them. bwrap and the in-sandbox init stay in the caller's cgroups, so the
// memory limit's OOM killer and the pids limit can never hit init (a fork
// bomb cannot starve it of the threads it needs to kill the bomb). Init
// starts every command from one dedicated thread that it has moved into the
// cgroup (v1: its thread id written to the tasks files, which are handed to
// it as open files) or, on v2, with clone3 CLONE_INTO_CGROUP (the cgroup
// directory is handed to it as an open file); so a command is born inside.
//
//	cgroup v1: memory/<ours>/kiln-ID (memory limit), pids/<ours>/kiln-ID (pids limit)
//	cgroup v2: <ours>/kiln-ID (memory.max, pids.max); needs a delegated parent
type cgroup struct {
	v2        bool
	dirs      []string // created, parents first
	handoff   []string // v1: tasks files; v2: the cgroup directory
	oomFile   string   // file with the "oom_kill N" counter
	pidsEvent string   // file with the "max N" counter
}

// cgroupPlan is where sandbox id's cgroups go, known before any exists,
// so that a sandbox can record them for Sweep before it creates them.
type cgroupPlan struct {
	v2   bool
	dirs []string // v1: memory, pids; v2: the one directory
}

// planCgroup finds the hierarchy to put sandbox id's cgroups in: under the
// calling process's own cgroups, named kiln-ID.
func planCgroup(id string) (cgroupPlan, error) {
	self, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return cgroupPlan{}, fmt.Errorf("read own cgroup: %w", err)
	}
	paths := map[string]string{} // controller ("" for v2) -> own path
	sc := bufio.NewScanner(bytes.NewReader(self))
	for sc.Scan() {
		f := strings.SplitN(sc.Text(), ":", 3)
		if len(f) != 3 {
			continue
		}
		for _, c := range strings.Split(f[1], ",") {
			paths[c] = f[2]
		}
	}
	name := "kiln-" + id
	switch {
	case fileExists("/sys/fs/cgroup/cgroup.controllers"):
		return cgroupPlan{v2: true, dirs: []string{filepath.Join("/sys/fs/cgroup", paths[""], name)}}, nil
	case fileExists("/sys/fs/cgroup/memory/cgroup.procs") && fileExists("/sys/fs/cgroup/pids/cgroup.procs"):
		return cgroupPlan{dirs: []string{
			filepath.Join("/sys/fs/cgroup/memory", paths["memory"], name),
			filepath.Join("/sys/fs/cgroup/pids", paths["pids"], name),
		}}, nil
	case v2Has("/sys/fs/cgroup/unified", "memory", "pids"):
		return cgroupPlan{v2: true, dirs: []string{filepath.Join("/sys/fs/cgroup/unified", paths[""], name)}}, nil
	}
	return cgroupPlan{}, errors.New("no cgroup with the memory and pids controllers found (cgroup v1 at /sys/fs/cgroup/{memory,pids} or a delegated cgroup v2); " +
		"run as root on a host with cgroups, or set MemoryBytes and PidsMax negative to run without limits (debugging only)")
}

// newCgroup creates the planned cgroups with the given limits.
func newCgroup(p cgroupPlan, memBytes, pidsMax int64) (cg *cgroup, err error) {
	cg = &cgroup{}
	defer func() {
		if err != nil {
			cg.remove()
		}
	}()
	if p.v2 {
		return cg, cg.setupV2(p.dirs[0], memBytes, pidsMax)
	}
	return cg, cg.setupV1(p.dirs[0], p.dirs[1], memBytes, pidsMax)
}

func (cg *cgroup) setupV1(mem, pids string, memBytes, pidsMax int64) error {
	// The two hierarchies are independent: create them concurrently.
	memErr := make(chan error, 1)
	go func() {
		if err := os.Mkdir(mem, 0o755); err != nil {
			memErr <- fmt.Errorf("create cgroup %q: %w", mem, err)
			return
		}
		memErr <- nil
	}()
	pidsErr := os.Mkdir(pids, 0o755)
	if pidsErr == nil {
		cg.dirs = append(cg.dirs, pids)
	}
	if err := <-memErr; err != nil {
		return err
	}
	cg.dirs = append(cg.dirs, mem)
	if pidsErr != nil {
		return fmt.Errorf("create cgroup %q: %w", pids, pidsErr)
	}
	if err := writeCg(mem, "memory.limit_in_bytes", memBytes); err != nil {
		return err
	}
	if fileExists(filepath.Join(mem, "memory.memsw.limit_in_bytes")) {
		// Swap counts against the same limit (best effort: absent without swap accounting).
		_ = writeCg(mem, "memory.memsw.limit_in_bytes", memBytes)
	}
	if err := writeCg(pids, "pids.max", pidsMax); err != nil {
		return err
	}
	cg.handoff = []string{filepath.Join(mem, "tasks"), filepath.Join(pids, "tasks")}
	cg.oomFile = filepath.Join(mem, "memory.oom_control")
	cg.pidsEvent = filepath.Join(pids, "pids.events")
	return nil
}

func (cg *cgroup) setupV2(dir string, memBytes, pidsMax int64) error {
	parent := filepath.Dir(dir)
	if !v2Has(parent, "memory", "pids") {
		return fmt.Errorf("cgroup v2 %q lacks the memory and pids controllers; delegate them to it", parent)
	}
	if err := os.WriteFile(filepath.Join(parent, "cgroup.subtree_control"), []byte("+memory +pids"), 0); err != nil {
		return fmt.Errorf("enable memory and pids controllers in cgroup %q (it must be delegated and hold no processes of its own): %w", parent, err)
	}
	if err := cg.mkdir(dir); err != nil {
		return err
	}
	if err := writeCg(dir, "memory.max", memBytes); err != nil {
		return err
	}
	_ = writeCg(dir, "memory.swap.max", 0)
	if err := writeCg(dir, "pids.max", pidsMax); err != nil {
		return err
	}
	cg.v2 = true
	cg.handoff = []string{dir}
	cg.oomFile = filepath.Join(dir, "memory.events")
	cg.pidsEvent = filepath.Join(dir, "pids.events")
	return nil
}

// open opens the files handed to the in-sandbox init.
func (cg *cgroup) open() ([]*os.File, error) {
	var fs []*os.File
	for _, p := range cg.handoff {
		flag := os.O_WRONLY
		if cg.v2 {
			flag = os.O_RDONLY | syscall.O_DIRECTORY
		}
		f, err := os.OpenFile(p, flag, 0)
		if err != nil {
			for _, f := range fs {
				f.Close()
			}
			return nil, fmt.Errorf("open %q: %w", p, err)
		}
		fs = append(fs, f)
	}
	return fs, nil
}

func (cg *cgroup) mkdir(d string) error {
	if err := os.Mkdir(d, 0o755); err != nil {
		return fmt.Errorf("create cgroup %q: %w", d, err)
	}
	cg.dirs = append(cg.dirs, d)
	return nil
}

func writeCg(dir, file string, v int64) error {
	p := filepath.Join(dir, file)
	if err := os.WriteFile(p, []byte(strconv.FormatInt(v, 10)), 0); err != nil {
		return fmt.Errorf("set %q to %d: %w", p, v, err)
	}
	return nil
}

// counters returns the OOM-kill and pids-limit-hit counts so far.
func (cg *cgroup) counters() (oom, pids int64) {
	if cg == nil {
		return 0, 0
	}
	return counter(cg.oomFile, "oom_kill"), counter(cg.pidsEvent, "max")
}

func counter(path, key string) int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, " "); ok && k == key {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}

// remove kills whatever is left in the cgroups, waits for it to be gone and
// removes the directories.
func (cg *cgroup) remove() error {
	if cg == nil {
		return nil
	}
	var errs []error
	for i := len(cg.dirs) - 1; i >= 0; i-- {
		d := cg.dirs[i]
		deadline := time.Now().Add(5 * time.Second)
		for {
			err := syscall.Rmdir(d)
			if err == nil || errors.Is(err, syscall.ENOENT) {
				break
			}
			if !errors.Is(err, syscall.EBUSY) || time.Now().After(deadline) {
				errs = append(errs, fmt.Errorf("remove cgroup %q: %w", d, err))
				break
			}
			killProcs(d)
			time.Sleep(2 * time.Millisecond)
		}
	}
	return errors.Join(errs...)
}

func killProcs(dir string) {
	if fileExists(filepath.Join(dir, "cgroup.kill")) {
		_ = os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0)
		return
	}
	b, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil && pid > 0 {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

func v2Has(dir string, controllers ...string) bool {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
	if err != nil {
		return false
	}
	have := strings.Fields(string(b))
	for _, c := range controllers {
		found := false
		for _, h := range have {
			found = found || h == c
		}
		if !found {
			return false
		}
	}
	return true
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
