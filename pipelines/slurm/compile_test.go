package slurm

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden sbatch scripts in testdata/")

// goldenJobs cover each kind of job: a plain one, a throttled array, a
// service and its user, and a multi-node GPU trainer.
func goldenJobs() []Job {
	return []Job{
		{Name: "train/2", Script: "$KILN_LAUNCH train.py --step 2\n", After: []string{"rollout/2"}, Nodes: 2, GPUs: 8, CPUs: 32, Memory: "500G", Time: "04:00:00", Partition: "gpu"},
		{Name: "data", Script: "kiln-convert mimo --out data\n", CPUs: 2, Memory: "4G", Time: "00:30:00"},
		{Name: "engine", Script: "serve --port 8000\n", Service: true, Health: "curl -fsS http://$KILN_SERVICE_ENGINE_HOST:8000/health", After: []string{"data"}, GPUs: 1},
		{Name: "rollout/2", Script: "kiln-rollout run --shard $KILN_SHARD\n", After: []string{"data", "engine"}, Shards: 4, Throttle: 2, CPUs: 1},
	}
}

func TestCompileGolden(t *testing.T) {
	scripts, err := Compile(goldenJobs(), CompileOptions{Dir: "/shared/run", HealthTimeout: 300})
	if err != nil {
		t.Fatal(err)
	}
	var order []string
	for _, s := range scripts {
		order = append(order, s.Name)
		golden := filepath.Join("testdata", s.File)
		if *update {
			if err := os.WriteFile(golden, []byte(s.Text), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		want, err := os.ReadFile(golden)
		if err != nil {
			t.Fatalf("%v (run go test -run TestCompileGolden -update)", err)
		}
		if s.Text != string(want) {
			t.Errorf("%s differs from %s:\n%s", s.Name, golden, s.Text)
		}
	}
	// The service's stop job comes last, after its users (afterany).
	if got, want := strings.Join(order, " "), "data engine rollout/2 train/2 engine.stop"; got != want {
		t.Errorf("order %q, want %q", got, want)
	}
	byName := map[string]Script{}
	for _, s := range scripts {
		byName[s.Name] = s
	}
	if r := byName["rollout/2"]; strings.Join(r.After, ",") != "data" || strings.Join(r.Started, ",") != "engine" {
		t.Errorf("rollout/2 after %v started %v, want [data] [engine]", r.After, r.Started)
	}
	if e := byName["engine"]; strings.Join(e.StopAfter, ",") != "rollout/2" {
		t.Errorf("engine stops after %v, want [rollout/2]", e.StopAfter)
	}
	if e := byName["engine.stop"]; strings.Join(e.AfterAny, ",") != "rollout/2" || e.File != "engine.stop.sbatch" {
		t.Errorf("engine's stop job: %+v, want engine.stop.sbatch afterany rollout/2", e)
	}
}

func TestCompileErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		jobs []Job
		want string
	}{
		{"duplicate", []Job{{Name: "a"}, {Name: "a"}}, `job "a" given twice`},
		{"unknown dep", []Job{{Name: "a", After: []string{"b"}}}, `depends on "b", which is not in the submission`},
		{"cycle", []Job{{Name: "a", After: []string{"b"}}, {Name: "b", After: []string{"a"}}}, "dependency cycle: a -> b -> a"},
		{"bad name", []Job{{Name: "a b"}}, `job "a b": a name is`},
		{"sharded service", []Job{{Name: "s", Service: true, Shards: 2}}, "cannot be sharded"},
		{"negative", []Job{{Name: "a", Shards: -1}}, "must not be negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Compile(tc.jobs, CompileOptions{Dir: "/d"})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestParseParsable(t *testing.T) {
	for in, want := range map[string]string{"123\n": "123", "77;cluster2\n": "77", "warning\n42\n": "42"} {
		got, err := ParseParsable(in)
		if err != nil || got != want {
			t.Errorf("ParseParsable(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", "Submitted batch job 12\n", "12_3\n"} {
		if _, err := ParseParsable(in); err == nil {
			t.Errorf("ParseParsable(%q) accepted it", in)
		}
	}
}

func TestWriteScripts(t *testing.T) {
	dir := t.TempDir()
	if _, err := WriteScripts(dir, goldenJobs(), CompileOptions{}); err != nil {
		t.Fatal(err)
	}
	order, err := os.ReadFile(filepath.Join(dir, "submit.order"))
	if err != nil {
		t.Fatal(err)
	}
	// Every job a submission has, the service's stop job included
	// (before, the dry run left it out).
	golden := filepath.Join("testdata", "submit.order")
	if *update {
		if err := os.WriteFile(golden, order, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run go test -run TestWriteScripts -update)", err)
	}
	if string(order) != string(want) {
		t.Errorf("submit.order:\n%s\nwant (%s):\n%s", order, golden, want)
	}
	for _, f := range []string{"data.sbatch", "engine.sbatch", "rollout--2.sbatch", "train--2.sbatch", "engine.stop.sbatch"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Error(err)
		}
	}
}
