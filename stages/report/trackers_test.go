package report_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kilnrl/kiln/internal/stagecmd/stagetest"
	"github.com/kilnrl/kiln/internal/testenv"
	"github.com/kilnrl/kiln/stages/report"
	"github.com/kilnrl/kiln/stages/report/reporttest"
)

// trackersVenv is the venv scripts/install-tracker-deps.sh made (wandb,
// tensorboard); skips without it, fails under CI=true.
func trackersVenv(t *testing.T) string {
	t.Helper()
	home, _ := os.UserHomeDir()
	b, err := os.ReadFile(filepath.Join(home, ".cache", "kiln", "trackers-venv-current"))
	venv := strings.TrimSpace(string(b))
	if err != nil || venv == "" {
		testenv.SkipOrFail(t, "no trackers venv (~/.cache/kiln/trackers-venv-current): run scripts/install-tracker-deps.sh")
	}
	if _, err := os.Stat(filepath.Join(venv, "bin", "wandb")); err != nil {
		testenv.SkipOrFail(t, "the trackers venv %s has no wandb: run scripts/install-tracker-deps.sh", venv)
	}
	return venv
}

// trackerWant is each tracker tag's JSON figure per step, from the
// report's JSON through chartFigures (not through the chart code), and
// each stage's wall time as wall/STAGE.
func trackerWant(r *report.Report) map[string]map[int]float64 {
	want := map[string]map[int]float64{}
	add := func(tag string, step int, v *float64) {
		if v == nil {
			return
		}
		if want[tag] == nil {
			want[tag] = map[int]float64{}
		}
		want[tag][step] = *v
	}
	for _, s := range r.Steps {
		for key, f := range chartFigures() {
			add(strings.ReplaceAll(key, " ", "_"), s.Step, f(s))
		}
		for stage, sec := range s.Wall {
			add("wall/"+strings.ReplaceAll(stage, " ", "_"), s.Step, &sec)
		}
	}
	return want
}

// TestTrackers: kiln report --tensorboard and --wandb write the per-step
// figures, read back with each tracker's own reader, equal the figures
// of kiln report --json:
//
//   - TensorBoard: tensorboard's EventAccumulator over the Go-written
//     event file, every tag's every step equal to the JSON figure as a
//     float32 (simple_value's type); a rerun leaves one kiln file in DIR;
//   - wandb: `wandb leet inspect --json`, wandb's reader of a run's .wandb
//     transaction log, over the offline run: finished, one history row
//     per step whose values equal the JSON figures exactly.
//
// No network: the run is offline, and its writer runs in a network
// namespace of its own where one can be made (unshare -n). Skips without the trackers' venv
// (scripts/install-tracker-deps.sh), fails without it under CI=true.
func TestTrackers(t *testing.T) {
	venv := trackersVenv(t)
	python := filepath.Join(venv, "bin", "python")
	// The wandb writer runs with no network at all where a network
	// namespace can be made (root, as in CI): offline must mean offline.
	if exec.Command("unshare", "-n", "true").Run() == nil {
		wrapper := filepath.Join(t.TempDir(), "python-no-network")
		if err := os.WriteFile(wrapper, []byte("#!/bin/sh\nexec unshare -n "+python+" \"$@\"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		python = wrapper
	} else {
		t.Log("unshare -n fails here: the wandb writer runs with the machine's network")
	}
	st, dir := newStore(t)
	run := reporttest.Write(t, st, reporttest.Options{Steps: 3, Staleness: 1, Samples: 4, Tasks: 3, Turns: 2})
	file := reporttest.Pipeline(t, st, t.TempDir(), "demo", run)
	r := reportJSON(t, "--store", dir, file)
	want := trackerWant(r)
	if len(want) < 20 {
		t.Fatalf("only %d tags expected: %v", len(want), want)
	}

	tb, wb := filepath.Join(t.TempDir(), "tb"), t.TempDir()
	page := filepath.Join(t.TempDir(), "report.html")
	for i := range 2 { // twice: the rerun replaces the event file
		args := []string{"report", "--store", dir, "--out", page, "--tensorboard", tb, "--python", python}
		if i == 1 {
			args = append(args, "--wandb", wb)
		}
		res := stagetest.Run(t, commands, append(args, file)...)
		if res.Code != 0 || res.LastLine() != page {
			t.Fatalf("kiln report: exit %d, last line %q:\n%s", res.Code, res.LastLine(), res.Stderr)
		}
		if !strings.Contains(res.Stderr, "tensorboard event file written") {
			t.Errorf("kiln report did not log the event file's path:\n%s", res.Stderr)
		}
	}
	events, _ := filepath.Glob(filepath.Join(tb, "events.out.tfevents.*"))
	if len(events) != 1 {
		t.Fatalf("after two runs %s holds %v, want one event file", tb, events)
	}

	t.Run("tensorboard", func(t *testing.T) {
		out, err := exec.Command(filepath.Join(venv, "bin", "python"), filepath.Join("testdata", "read_tensorboard.py"), tb).Output()
		if err != nil {
			t.Fatalf("EventAccumulator over %s: %v\n%s", tb, err, stderrOf(err))
		}
		var got map[string][][3]float64
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		compare(t, want, func(tag string) (map[int]float64, bool) {
			pts, ok := got[tag]
			m := map[int]float64{}
			for _, p := range pts {
				if _, dup := m[int(p[0])]; dup {
					t.Errorf("tensorboard %s: step %g twice", tag, p[0])
				}
				m[int(p[0])] = p[1]
			}
			return m, ok
		}, keys(got), func(v float64) float64 { return float64(float32(v)) })
	})

	t.Run("wandb", func(t *testing.T) {
		runs, _ := filepath.Glob(filepath.Join(wb, "wandb", "offline-run-*"))
		if len(runs) != 1 {
			t.Fatalf("%s/wandb holds runs %v, want one offline-run-*", wb, runs)
		}
		inspect := func(args ...string) []byte {
			cmd := exec.Command(filepath.Join(venv, "bin", "wandb"), append([]string{"leet", "inspect", "--json"}, args...)...)
			cmd.Env = append(os.Environ(), "WANDB_MODE=offline", "WANDB_SILENT=true")
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("wandb leet inspect %v: %v\n%s", args, err, stderrOf(err))
			}
			return out
		}
		var sum struct {
			State, Project, Name string
			Step                 int
		}
		if err := json.Unmarshal(inspect("--summary", runs[0]), &sum); err != nil {
			t.Fatal(err)
		}
		last := r.Steps[len(r.Steps)-1].Step
		if sum.State != "finished" || sum.Project != "demo" || sum.Name != "demo" || sum.Step != last {
			t.Errorf("wandb run summary %+v, want finished, project and name demo, step %d", sum, last)
		}
		got := map[string]map[int]float64{}
		sc := bufio.NewScanner(strings.NewReader(string(inspect(runs[0]))))
		sc.Buffer(nil, 1<<24)
		rows := 0
		for sc.Scan() {
			var rec struct {
				Type    string
				History struct {
					Item map[string]any
					Step struct{ Num int }
				}
			}
			if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
				t.Fatalf("%v: %s", err, sc.Bytes())
			}
			if rec.Type != "history" {
				continue
			}
			rows++
			for k, v := range rec.History.Item {
				if strings.HasPrefix(k, "_") {
					continue
				}
				f, ok := v.(float64)
				if !ok {
					t.Errorf("wandb %s at step %d is %T %v, not a number", k, rec.History.Step.Num, v, v)
					continue
				}
				if got[k] == nil {
					got[k] = map[int]float64{}
				}
				got[k][rec.History.Step.Num] = f
			}
		}
		if rows != len(r.Steps) {
			t.Errorf("wandb run has %d history rows, want one per step (%d)", rows, len(r.Steps))
		}
		compare(t, want, func(tag string) (map[int]float64, bool) { m, ok := got[tag]; return m, ok }, keys(got), func(v float64) float64 { return v })
	})
}

// compare checks that every tag the test wants is read back with the
// wanted value at each step (after round, the tracker's precision), and
// that the tracker holds no tag the test does not know.
func compare(t *testing.T, want map[string]map[int]float64, read func(string) (map[int]float64, bool), tags []string, round func(float64) float64) {
	t.Helper()
	for tag, steps := range want {
		got, ok := read(tag)
		if !ok {
			t.Errorf("tag %s is missing", tag)
			continue
		}
		if len(got) != len(steps) {
			t.Errorf("tag %s has %d steps %v, want %d", tag, len(got), got, len(steps))
		}
		for step, w := range steps {
			g, ok := got[step]
			if !ok || g != round(w) {
				t.Errorf("tag %s step %d: read back %v, the JSON figure is %v (%v at the tracker's precision)", tag, step, g, w, round(w))
			}
		}
	}
	for _, tag := range tags {
		if _, ok := want[tag]; !ok {
			t.Errorf("tag %s: the test does not know which figure it is", tag)
		}
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func stderrOf(err error) string {
	if e, ok := err.(*exec.ExitError); ok {
		return string(e.Stderr)
	}
	return fmt.Sprint(err)
}

// TestTrackersBadInput: --wandb with an interpreter that lacks wandb, or
// none at all, is a clear error naming it, and no page is written; a
// --tensorboard DIR that is a file is an error naming it.
func TestTrackersBadInput(t *testing.T) {
	st, dir := newStore(t)
	run := reporttest.Write(t, st, reporttest.Options{Steps: 1})
	ref := run.Steps[0].Checkpoints.String()
	bare := filepath.Join(t.TempDir(), "bare")
	if out, err := exec.Command("python3", "-m", "venv", "--without-pip", bare).CombinedOutput(); err != nil {
		t.Fatalf("python3 -m venv: %v\n%s", err, out)
	}
	aFile := filepath.Join(t.TempDir(), "file")
	os.WriteFile(aFile, []byte("x"), 0o644)
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"no wandb", []string{"--wandb", t.TempDir(), "--python", filepath.Join(bare, "bin", "python")}, []string{"cannot import wandb", "install-tracker-deps.sh", filepath.Join(bare, "bin", "python")}},
		{"no python", []string{"--wandb", t.TempDir(), "--python", "/nonexistent/python"}, []string{"/nonexistent/python"}},
		{"tensorboard on a file", []string{"--tensorboard", aFile}, []string{"--tensorboard", aFile}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			page := filepath.Join(t.TempDir(), "report.html")
			res := stagetest.Run(t, commands, append(append([]string{"report", "--store", dir, "--out", page}, tc.args...), ref)...)
			if res.Code == 0 {
				t.Fatalf("exit 0, want an error:\n%s", res.Stdout)
			}
			for _, w := range tc.want {
				if !strings.Contains(res.Stderr, w) {
					t.Errorf("stderr lacks %q:\n%s", w, res.Stderr)
				}
			}
			if _, err := os.Stat(page); err == nil {
				t.Errorf("a page was written though the trackers failed")
			}
		})
	}
}
