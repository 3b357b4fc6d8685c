package train

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kilnrl/kiln/internal/stagecmd"
)

// Launcher is how the trainer is started (docs/train-stage.md §8).
type Launcher string

const (
	LaunchPython   Launcher = "python"
	LaunchTorchrun Launcher = "torchrun"
	LaunchSrun     Launcher = "srun"
)

// ParseLauncher checks a --launcher value.
func ParseLauncher(s string) (Launcher, error) {
	switch l := Launcher(s); l {
	case LaunchPython, LaunchTorchrun, LaunchSrun:
		return l, nil
	}
	return "", fmt.Errorf("--launcher %q: want python, torchrun or srun", s)
}

// Command is the trainer's argv for plan (an absolute path): python runs
// one process; torchrun runs python's torch.distributed.run (torchrun
// itself) with nproc processes; srun starts nproc tasks of python.
func Command(l Launcher, python string, nproc int, plan string) []string {
	train := []string{"-m", "kiln_gpu.train", "--plan", plan}
	switch l {
	case LaunchTorchrun:
		return append([]string{python, "-m", "torch.distributed.run", "--nproc-per-node", fmt.Sprint(nproc)}, train...)
	case LaunchSrun:
		// Each task maps Slurm's rank variables onto torch.distributed's
		// before exec'ing the trainer (docs/train-stage.md §8).
		return append([]string{"srun", "--ntasks", fmt.Sprint(nproc), "--kill-on-bad-exit=1", "sh", "-c", srunShim, python}, train...)
	}
	return append([]string{python}, train...)
}

// srunShim is the per-task wrapper of the srun launcher: the trainer reads
// RANK, WORLD_SIZE and LOCAL_RANK (as under torchrun); Slurm sets
// SLURM_PROCID, SLURM_NTASKS and SLURM_LOCALID.
const srunShim = `RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS LOCAL_RANK=$SLURM_LOCALID exec "$0" "$@"`

// launchEnv is what a launcher adds to the trainer's environment: for
// srun, the rendezvous (MASTER_ADDR, MASTER_PORT) of torch.distributed's
// env:// initialisation, this host and a free port unless already set,
// which srun passes on to every task.
func launchEnv(l Launcher, getenv func(string) string) []string {
	if l != LaunchSrun {
		return nil
	}
	var env []string
	if getenv("MASTER_ADDR") == "" {
		if h, err := os.Hostname(); err == nil {
			env = append(env, "MASTER_ADDR="+h)
		}
	}
	if getenv("MASTER_PORT") == "" {
		port := 29500
		if ln, err := net.Listen("tcp", ":0"); err == nil {
			port = ln.Addr().(*net.TCPAddr).Port
			ln.Close()
		}
		env = append(env, fmt.Sprintf("MASTER_PORT=%d", port))
	}
	return env
}

// DefaultPython is the trainer's interpreter when --python is not given:
// $KILN_PYTHON, else the gpu virtual environment that
// scripts/install-gpu-deps.sh recorded, else python3 on PATH.
func DefaultPython(getenv func(string) string) string {
	if p := getenv("KILN_PYTHON"); p != "" {
		return p
	}
	if home, err := os.UserHomeDir(); err == nil {
		if b, err := os.ReadFile(filepath.Join(home, ".cache", "kiln", "gpu-venv-current")); err == nil {
			p := filepath.Join(strings.TrimSpace(string(b)), "bin", "python")
			if _, err := os.Stat(p); err == nil {
				return p
			}
		}
	}
	return "python3"
}

// executable is os.Executable; tests replace it to lay a binary out.
var executable = os.Executable

// DefaultGPUDir finds the directory holding kiln_gpu/ when --gpu-dir is
// not given: $KILN_GPU_DIR, else gpu/ beside the directory of the running
// binary (symlinks resolved): BIN/../gpu, which is REPO/gpu for make
// build's REPO/bin/kiln-train. "" when that has no kiln_gpu/.
//
// Never the working directory or its ancestors: whoever can write a
// gpu/kiln_gpu/train.py above where kiln-train is run would otherwise
// choose the code the trainer runs (docs/train-stage.md §8).
func DefaultGPUDir(getenv func(string) string) string {
	if d := getenv("KILN_GPU_DIR"); d != "" {
		return d
	}
	self, err := executable()
	if err != nil {
		return ""
	}
	if r, err := filepath.EvalSymlinks(self); err == nil {
		self = r
	}
	d := filepath.Join(filepath.Dir(filepath.Dir(self)), "gpu")
	if !isDir(filepath.Join(d, "kiln_gpu")) {
		return ""
	}
	return d
}

// Event is one JSON line of the trainer's stdout (docs/train-stage.md §9).
type Event struct {
	Event string         `json:"event"`
	Step  int            `json:"step"`
	Steps int            `json:"steps"`
	Dir   string         `json:"dir"`
	Raw   map[string]any `json:"-"`
}

// TrainerRun is one trainer process group's outcome.
type TrainerRun struct {
	Steps []map[string]any // the step events, in order
	Saved string           // the dir of the saved event
}

// Launch is how RunTrainer starts the trainer: Argv in Dir with GPUDir on
// PYTHONPATH and Env added to kiln-train's environment, or, with Socket,
// a run of Plan on the warm trainer listening there (forkserver.go).
type Launch struct {
	Argv, Env         []string
	Dir, GPUDir, Plan string
	Socket            string
}

// trainerProc is a started trainer: its stdout and stderr, and wait,
// which returns once it has exited (an error for a non-zero status).
type trainerProc struct {
	stdout, stderr io.Reader
	wait           func() error
}

// startExec starts l.Argv as a process group of its own.
func startExec(ctx context.Context, l Launch) (*trainerProc, error) {
	cmd := exec.CommandContext(ctx, l.Argv[0], l.Argv[1:]...)
	cmd.Dir = l.Dir
	// The trainer runs in its own process group, and cancelling (a signal
	// to kiln-train) stops the whole group: torchrun's and srun's workers
	// too, not only the launcher. SIGTERM first, SIGKILL 10 s later.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	env := os.Environ()
	pp := l.GPUDir
	if old := os.Getenv("PYTHONPATH"); old != "" {
		pp += string(os.PathListSeparator) + old
	}
	cmd.Env = append(append(env, "PYTHONPATH="+pp, "PYTHONUNBUFFERED=1"), l.Env...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	errPipe, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting the trainer %q: %w (set --python or KILN_PYTHON; scripts/install-gpu-deps.sh builds the environment)", l.Argv[0], err)
	}
	return &trainerProc{stdout: out, stderr: errPipe, wait: cmd.Wait}, nil
}

// RunTrainer runs the trainer as l says, reporting each step event to
// progress and passing stderr to log lines prefixed "trainer: ". It
// fails unless the trainer exits 0 after a saved event.
func RunTrainer(ctx context.Context, l Launch, stderr io.Writer, log *slog.Logger, progress *stagecmd.Progress) (*TrainerRun, error) {
	start := startExec
	if l.Socket != "" {
		start = startForkserver
	}
	p, err := start(ctx, l)
	if err != nil {
		return nil, err
	}
	out, errPipe := p.stdout, p.stderr
	argv := l.Argv
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		sc := bufio.NewScanner(errPipe)
		sc.Buffer(make([]byte, 64<<10), 4<<20)
		for sc.Scan() {
			fmt.Fprintf(stderr, "trainer: %s\n", sc.Text())
		}
	}()
	run := &TrainerRun{}
	var badLine string
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var raw map[string]any
		if json.Unmarshal(line, &raw) != nil {
			fmt.Fprintf(stderr, "trainer: %s\n", line)
			continue
		}
		switch raw["event"] {
		case "start":
			log.Debug("trainer started", "event", string(line))
		case "step":
			run.Steps = append(run.Steps, raw)
			if progress != nil {
				progress.Add(1)
			}
			log.Debug("trainer step", "event", string(line))
		case "saved":
			run.Saved, _ = raw["dir"].(string)
		default:
			if badLine == "" {
				badLine = string(line)
			}
		}
	}
	io.Copy(io.Discard, out)
	wg.Wait()
	err = p.wait()
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	if err != nil {
		// %v, not %w: the trainer's exit status is not kiln-train's
		// (exec.ExitError carries an exit code stagecmd would adopt).
		return nil, fmt.Errorf("the trainer failed after %d step(s) (%v); its stderr is above, prefixed \"trainer:\"; nothing was committed, and a rerun of the same command starts again: %v", len(run.Steps), strings.Join(argv, " "), err)
	}
	if badLine != "" {
		log.Warn("trainer printed an unknown event", "line", badLine)
	}
	if run.Saved == "" {
		return nil, fmt.Errorf("the trainer exited 0 without a saved event: nothing was committed")
	}
	return run, nil
}

// CheckOut checks what the trainer saved in out (docs/train-stage.md §6):
// the index and every shard it names, config.json, the base's non-weight
// files and the trainer's own files.
func CheckOut(out string, base *Model) error {
	has := func(f string) bool {
		fi, err := os.Stat(filepath.Join(out, f))
		return err == nil && fi.Mode().IsRegular()
	}
	var missing []string
	need := append([]string{"model.safetensors.index.json", "config.json", "metrics.jsonl", "optimizer.pt", "trainer_state.json"}, base.BaseFiles...)
	for _, f := range need {
		if !has(f) {
			missing = append(missing, f)
		}
	}
	if b, err := os.ReadFile(filepath.Join(out, "model.safetensors.index.json")); err == nil {
		var idx struct {
			WeightMap map[string]string `json:"weight_map"`
		}
		if err := json.Unmarshal(b, &idx); err != nil || len(idx.WeightMap) == 0 {
			return fmt.Errorf("trainer output %q: model.safetensors.index.json has no weight_map (%v)", out, err)
		}
		seen := map[string]bool{}
		for _, shard := range idx.WeightMap {
			if !seen[shard] && !has(shard) {
				missing = append(missing, shard)
			}
			seen[shard] = true
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("the trainer exited 0 but %q lacks %s: nothing was committed (a trainer bug: see docs/train-stage.md §6)", out, strings.Join(missing, ", "))
	}
	return nil
}
