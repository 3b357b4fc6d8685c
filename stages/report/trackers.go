package report

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/kilnrl/kiln/internal/tfevents"
)

// StepScalars are one step's figures as the trackers get them
// (docs/report.md §5): every point the page's charts draw for the step,
// tagged CHART/SERIES (spaces as underscores), in the charts' order.
type StepScalars struct {
	Step    int
	Scalars []tfevents.Scalar
}

// Scalars are the report's per-step figures for the trackers: the page's
// chart points, so the page, the JSON and the trackers hold the same
// numbers. Steps without any figure are left out.
func Scalars(r *Report) []StepScalars {
	byStep := map[int]*StepScalars{}
	for _, c := range charts(r) {
		for _, s := range c.Series {
			tag := Tag(c.ID, s.Name)
			for _, p := range s.Points {
				x := byStep[p.Step]
				if x == nil {
					x = &StepScalars{Step: p.Step}
					byStep[p.Step] = x
				}
				x.Scalars = append(x.Scalars, tfevents.Scalar{Tag: tag, Value: p.Value})
			}
		}
	}
	out := make([]StepScalars, 0, len(byStep))
	for _, x := range byStep {
		out = append(out, *x)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Step < out[j].Step })
	return out
}

// Tag is a chart series' tracker tag: CHART/SERIES, spaces as underscores
// ("pass/pass_rate", "wall/rollout").
func Tag(chartID, series string) string {
	return chartID + "/" + strings.ReplaceAll(series, " ", "_")
}

// tbSuffix ends the name of the event files kiln report writes, so a
// rerun replaces its own earlier file and leaves any other alone.
const tbSuffix = ".kiln-report"

// WriteTensorBoard writes the report's scalars as one TensorBoard event
// file in dir (created if needed): events.out.tfevents.SECONDS.kiln-report,
// one event per step (step = the pipeline step, wall time = now), written
// beside its place and renamed; then kiln report's earlier event files in
// dir are removed, so dir holds one run. It returns the file's path.
func WriteTensorBoard(r *Report, dir string, now time.Time) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	old, err := filepath.Glob(filepath.Join(dir, "events.out.tfevents.*"+tbSuffix))
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, fmt.Sprintf("events.out.tfevents.%d%s", now.Unix(), tbSuffix))
	wall := float64(now.UnixNano()) / 1e9
	var b bytes.Buffer
	w, err := tfevents.NewWriter(&b, wall)
	if err != nil {
		return "", err
	}
	for _, s := range Scalars(r) {
		if err := w.Scalars(int64(s.Step), wall, s.Scalars); err != nil {
			return "", err
		}
	}
	if err := w.Flush(); err != nil {
		return "", err
	}
	tmp := filepath.Join(dir, ".tmp-"+filepath.Base(path))
	if err := os.WriteFile(tmp, b.Bytes(), 0o644); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, path); err != nil {
		return "", err
	}
	for _, o := range old {
		if o != path {
			if err := os.Remove(o); err != nil {
				return "", err
			}
		}
	}
	return path, nil
}

//go:embed assets/wandb_run.py
var wandbScript string

// WandbOptions configure WriteWandb.
type WandbOptions struct {
	// Dir is wandb's directory: the run goes to Dir/wandb/offline-run-*.
	Dir string
	// Project and Name are the run's project and display name.
	Project, Name string
	// Python is the interpreter that has wandb (DefaultPython).
	Python string
	// Environ is the interpreter's environment (WANDB_MODE=offline and
	// WANDB_SILENT=true are added).
	Environ []string
}

// DefaultPython is the trackers' interpreter: $KILN_TRACKERS_PYTHON, else
// the venv scripts/install-tracker-deps.sh recorded in
// ~/.cache/kiln/trackers-venv-current, else python3 from PATH.
func DefaultPython(environ []string) string {
	for _, kv := range environ {
		if v, ok := strings.CutPrefix(kv, "KILN_TRACKERS_PYTHON="); ok && v != "" {
			return v
		}
	}
	if home, err := os.UserHomeDir(); err == nil {
		if b, err := os.ReadFile(filepath.Join(home, ".cache", "kiln", "trackers-venv-current")); err == nil {
			if p := filepath.Join(strings.TrimSpace(string(b)), "bin", "python"); fileExists(p) {
				return p
			}
		}
	}
	return "python3"
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// WriteWandb writes the report's scalars as a wandb run in offline mode
// (docs/report.md §5) by running assets/wandb_run.py with o.Python: one
// history row per step (step = the pipeline step), the report's identity
// as the run's config. It returns the run's directory, which `wandb sync`
// uploads. Nothing leaves the machine.
func WriteWandb(ctx context.Context, r *Report, o WandbOptions) (string, error) {
	if o.Python == "" {
		o.Python = DefaultPython(o.Environ)
	}
	dir, err := filepath.Abs(o.Dir)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	type step struct {
		Step    int                `json:"step"`
		Scalars map[string]float64 `json:"scalars"`
	}
	spec := struct {
		Dir     string         `json:"dir"`
		Project string         `json:"project"`
		Name    string         `json:"name"`
		Config  map[string]any `json:"config"`
		Steps   []step         `json:"steps"`
	}{Dir: dir, Project: o.Project, Name: o.Name, Steps: []step{},
		Config: map[string]any{"kiln_report": Format, "store": r.Store, "pipeline": r.Pipeline, "pipeline_name": r.PipelineName, "refs": r.Refs}}
	for _, s := range Scalars(r) {
		x := step{Step: s.Step, Scalars: map[string]float64{}}
		for _, v := range s.Scalars {
			x.Scalars[v.Tag] = v.Value
		}
		spec.Steps = append(spec.Steps, x)
	}
	in, err := json.Marshal(spec)
	if err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, o.Python, "-c", wandbScript)
	cmd.Env = append(append([]string{}, o.Environ...), "WANDB_MODE=offline", "WANDB_SILENT=true")
	cmd.Stdin = bytes.NewReader(in)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if strings.Contains(msg, "No module named 'wandb'") {
			return "", fmt.Errorf("--wandb: %q cannot import wandb: run scripts/install-tracker-deps.sh, or give --python (or $KILN_TRACKERS_PYTHON) an interpreter that has it", o.Python)
		}
		if len(msg) > 4000 {
			msg = "..." + msg[len(msg)-4000:]
		}
		return "", fmt.Errorf("--wandb: %s writing the offline run in %q: %w\n%s", o.Python, dir, err, msg)
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	run := strings.TrimSpace(lines[len(lines)-1])
	if !strings.HasPrefix(filepath.Base(run), "offline-run-") || !fileExists(run) {
		return "", fmt.Errorf("--wandb: %s did not say where the offline run is (stdout %q)", o.Python, stdout.String())
	}
	return run, nil
}
