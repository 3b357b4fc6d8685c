package pipelines_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/pipelines"
)

// shippedVars are the variables each shipped pipeline is planned with in
// the golden test: the defaults, except a short mimo-full (4 steps, an
// eval every 2, so the goldens show every= at work).
var shippedVars = map[string][]string{
	"mimo-smoke": nil,
	"demo":       nil,
	"mimo-full":  {"STEPS=4", "EVAL_EVERY=2"},
	"replay":     {"AT=@0123456789abcdef0123", "RESUME=--resume-from mimo-full/checkpoints/step-2@fedcba9876543210fedc"},
}

// TestShippedPipelines plans every shipped pipeline (pipelines/*.kiln) on
// an empty store and compares with golden files in testdata/shipped/NAME:
// recipes.txt (every target's prerequisites, attributes and expanded
// recipe, refs as ${KILN_REF_n} with what each stands for), plan.txt
// (kiln plan's output) and sbatch/ (kiln slurm --dry-run's scripts and
// submit.order, with this machine's paths replaced by KILN, STORE, SPEC
// and RUN). Regenerate with go test ./pipelines -run TestShippedPipelines
// -update, and read the diff: it is what a user's cluster would run.
func TestShippedPipelines(t *testing.T) {
	files, err := filepath.Glob("*.kiln")
	if err != nil || len(files) == 0 {
		t.Fatalf("no shipped pipelines (*.kiln) in pipelines/: %v", err)
	}
	kiln := kilnEnv(t)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// Only kiln on PATH: no stage answers kiln plan's --print-version
	// probe, so the plan does not depend on what this machine has built.
	t.Setenv("PATH", filepath.Dir(kiln)+string(os.PathListSeparator)+"/usr/bin:/bin")
	for _, file := range files {
		name := strings.TrimSuffix(file, ".kiln")
		vars, ok := shippedVars[name]
		if !ok {
			t.Errorf("%s: add its variables to shippedVars", file)
			continue
		}
		t.Run(name, func(t *testing.T) {
			work := t.TempDir()
			storeDir := filepath.Join(work, "store")
			spec := filepath.Join(work, file)
			src, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(spec, src, 0o644); err != nil {
				t.Fatal(err)
			}
			runDir := filepath.Join(work, "run")
			norm := strings.NewReplacer(exe, "KILN", storeDir, "STORE", spec, "SPEC", runDir, "RUN")
			golden := filepath.Join("testdata", "shipped", name)
			got := map[string]string{}

			got["recipes.txt"] = recipes(t, spec, storeDir, vars)
			kilnRun := func(args ...string) string {
				t.Helper()
				c := execKiln(kiln, work, args...)
				out, err := c.CombinedOutput()
				if err != nil {
					t.Fatalf("kiln %s: %v\n%s", strings.Join(args, " "), err, out)
				}
				return string(out)
			}
			got["plan.txt"] = norm.Replace(kilnRun(append([]string{"--store", storeDir, "plan", spec}, vars...)...))
			dry := filepath.Join(work, "dry")
			kilnRun(append([]string{"--store", storeDir, "slurm", "--dry-run", dry, "--dir", runDir, spec}, vars...)...)
			scripts, err := os.ReadDir(dry)
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range scripts {
				b, err := os.ReadFile(filepath.Join(dry, s.Name()))
				if err != nil {
					t.Fatal(err)
				}
				got[filepath.Join("sbatch", s.Name())] = norm.Replace(string(b))
			}
			if strings.Contains(strings.Join(mapValues(got), ""), work) {
				t.Errorf("a golden file still holds the test's directory %s", work)
			}
			compareGolden(t, golden, got)
		})
	}
}

// recipes renders the plan's targets: name, prerequisites, attributes,
// the expanded recipe and what each ref placeholder stands for.
func recipes(t *testing.T, spec, storeDir string, vars []string) string {
	t.Helper()
	vm := map[string]string{}
	for _, v := range vars {
		k, val, _ := strings.Cut(v, "=")
		vm[k] = val
	}
	s, err := pipelines.Load(spec, vm, nil)
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(storeDir)
	if err != nil {
		t.Fatal(err)
	}
	p, err := pipelines.NewPlan(context.Background(), s, pipelines.PlanOptions{Store: st, NoProbe: true})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, tg := range p.Targets {
		fmt.Fprintf(&b, "%s:", tg.Name)
		for _, d := range tg.Deps {
			fmt.Fprintf(&b, " %s", d)
		}
		b.WriteString("\n")
		if a := attrString(tg); a != "" {
			fmt.Fprintf(&b, "\t[%s]\n", a)
		}
		for _, l := range tg.Recipe {
			fmt.Fprintf(&b, "\t%s\n", l)
		}
		keys := make([]string, 0, len(tg.Refs))
		for k := range tg.Refs {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Fprintf(&b, "\t# ${%s} = ref %s\n", k, tg.Refs[k])
		}
	}
	return b.String()
}

func attrString(tg *pipelines.Target) string {
	a := tg.Attrs
	var f []string
	add := func(k string, v any, zero bool) {
		if !zero {
			f = append(f, fmt.Sprintf("%s=%v", k, v))
		}
	}
	if tg.Service {
		f = append(f, "service")
	}
	add("cpus", a.CPUs, a.CPUs == 0)
	add("gpus", a.GPUs, a.GPUs == 0)
	add("nodes", a.Nodes, a.Nodes == 0)
	add("shards", a.Shards, a.Shards == 0)
	add("throttle", a.Throttle, a.Throttle == 0)
	add("retries", a.Retries, a.Retries == 0)
	add("every", a.Every, a.Every == 0)
	add("memory", a.Memory, a.Memory == "")
	add("time", a.Time, a.Time == "")
	add("partition", a.Partition, a.Partition == "")
	add("health", fmt.Sprintf("%q", a.Health), a.Health == "")
	add("out", a.Out, a.Out == "")
	return strings.Join(f, " ")
}

// compareGolden compares got (file name relative to dir -> content) with
// the files under dir, or rewrites dir with -update.
func compareGolden(t *testing.T, dir string, got map[string]string) {
	t.Helper()
	if updating() {
		if err := os.RemoveAll(dir); err != nil {
			t.Fatal(err)
		}
		for name, text := range got {
			p := filepath.Join(dir, name)
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return
	}
	have := map[string]bool{}
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		have[rel] = true
		return nil
	})
	if err != nil {
		t.Fatalf("%v (run go test ./pipelines -run TestShippedPipelines -update)", err)
	}
	for name, text := range got {
		want, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Errorf("%s: no golden file (run with -update): %v", name, err)
			continue
		}
		if string(want) != text {
			t.Errorf("%s differs from %s (run with -update and review the diff):\n%s", name, filepath.Join(dir, name), text)
		}
	}
	for name := range have {
		if _, ok := got[name]; !ok {
			t.Errorf("golden file %s is no longer produced", filepath.Join(dir, name))
		}
	}
}

func mapValues(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	return out
}

// execKiln is the kiln command (this test binary, see TestMain) run in dir.
func execKiln(kiln, dir string, args ...string) *exec.Cmd {
	c := exec.Command(kiln, args...)
	c.Dir = dir
	return c
}

// updating reports -update, the flag spec_test.go (package pipelines, the
// same test binary) defines.
func updating() bool {
	f := flag.Lookup("update")
	return f != nil && f.Value.String() == "true"
}

// TestEvery: every=N keeps the step instances that are multiples of N, a
// prerequisite naming a left-out instance is dropped, and every= on a
// rule without $(step) is an error.
func TestEvery(t *testing.T) {
	src := "STEPS = 4\nN ?= 2\neval/$(step): [every=$(N)]\n\ttrue\nw/$(step): eval/$(step)\n\ttrue\n"
	s, err := pipelines.Parse("e.kiln", []byte(src), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	p, err := pipelines.NewPlan(context.Background(), s, pipelines.PlanOptions{Store: st, NoProbe: true})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, tg := range p.Targets {
		got[tg.Name] = strings.Join(tg.Deps, ",")
	}
	want := map[string]string{"eval/2": "", "eval/4": "", "w/1": "", "w/2": "eval/2", "w/3": "", "w/4": "eval/4"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("targets and prerequisites %v, want %v", got, want)
	}
	if _, err := pipelines.Parse("e.kiln", []byte("a: [every=2]\n\ttrue\n"), nil, nil); err == nil {
		s, _ := pipelines.Parse("e.kiln", []byte("a: [every=2]\n\ttrue\n"), nil, nil)
		if _, err := pipelines.NewPlan(context.Background(), s, pipelines.PlanOptions{Store: st, NoProbe: true}); err == nil || !strings.Contains(err.Error(), "not a step rule") {
			t.Errorf("every= on a plain rule: %v, want an error saying it is not a step rule", err)
		}
	}
}
