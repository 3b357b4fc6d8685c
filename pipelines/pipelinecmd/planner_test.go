package pipelinecmd

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/kilnrl/kiln/internal/stagecmd"
	"github.com/kilnrl/kiln/pipelines"
	"github.com/kilnrl/kiln/pipelines/slurm"
)

const testSpec = `N ?= 4
data:
	echo data
engine: [service health="true"] data
	sleep 300
shards: [shards=$(N) throttle=2 cpus=1] data engine
	echo shard $$KILN_SHARD
final: shards
	echo final
`

// TestPipelinePlannerDryRun plans a real spec with the pipelines package
// and writes the sbatch scripts kiln slurm would submit.
func TestPipelinePlannerDryRun(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "p.kiln")
	if err := os.WriteFile(file, []byte(testSpec), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	env := &stagecmd.Env{Stdout: &out, Stderr: &errb, Log: stagecmd.NewLogger(&errb, false)}
	app := env.App(&cli.App{Name: "kiln", Commands: slurm.Commands(env, slurm.Options{Plan: planner(env), Kiln: "/opt/kiln"})})
	dry := filepath.Join(dir, "dry")
	args := []string{"kiln", "--store", filepath.Join(dir, "store"), "slurm", file, "N=3", "--dry-run", dry}
	if code := stagecmd.Main(app, args, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	order, err := os.ReadFile(filepath.Join(dry, "submit.order"))
	if err != nil {
		t.Fatal(err)
	}
	// Every job kiln slurm would submit, the service's stop job included.
	want := "data.sbatch\nengine.sbatch afterok=data\nshards.sbatch afterok=data after=engine\nfinal.sbatch afterok=shards\nengine.stop.sbatch afterany=shards\n"
	if string(order) != want {
		t.Errorf("submit.order:\n%s\nwant:\n%s", order, want)
	}
	stop, err := os.ReadFile(filepath.Join(dry, "engine.stop.sbatch"))
	if err != nil || !strings.Contains(string(stop), "touch "+filepath.Join(dir, ".kiln-slurm", "p", "services", "engine.stop")+"\n") {
		t.Errorf("engine.stop.sbatch (%v):\n%s", err, stop)
	}
	sh, _ := os.ReadFile(filepath.Join(dry, "shards.sbatch"))
	for _, w := range []string{"#SBATCH --array=0-2%2\n", "#SBATCH --cpus-per-task=1\n", `/opt/kiln --store ` + filepath.Join(dir, "store") + ` run ` + file + ` --only shards --shard "$KILN_SHARD" N=3`} {
		if !strings.Contains(string(sh), w) {
			t.Errorf("shards.sbatch lacks %q:\n%s", w, sh)
		}
	}
}

// TestPlanWithSlurm: kiln plan --slurm prints, after the plan, the jobs
// kiln slurm would submit, compiled from the same targets.
func TestPlanWithSlurm(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "p.kiln")
	if err := os.WriteFile(file, []byte(testSpec), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	env := &stagecmd.Env{Stdout: &out, Stderr: &errb, Log: stagecmd.NewLogger(&errb, false)}
	app := env.App(&cli.App{Name: "kiln", Commands: Commands(env)})
	args := []string{"kiln", "--store", filepath.Join(dir, "store"), "plan", file, "N=3", "--slurm", "--slurm-dir", filepath.Join(dir, "run")}
	if code := stagecmd.Main(app, args, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	want := `run  data: never built
run  engine: started for shards
run  shards: prerequisite data runs first
run  final: prerequisite shards runs first
sbatch data.sbatch
sbatch engine.sbatch service afterok=data
sbatch shards.sbatch array=0-2%2 afterok=data after=engine cpus=1
sbatch final.sbatch afterok=shards
sbatch engine.stop.sbatch afterany=shards
slurm: 5 job(s) to submit; 0 target(s) already in Slurm
`
	if out.String() != want {
		t.Errorf("kiln plan --slurm printed\n%s\nwant\n%s", out.String(), want)
	}
	if _, err := os.Stat(filepath.Join(dir, "run")); err == nil {
		t.Error("kiln plan --slurm wrote the run directory")
	}
}

// TestServiceHostVar: the job scripts export the variable kiln run reads
// to know a service runs elsewhere (pipelines.ServiceHostVar), spelled the
// same way.
func TestServiceHostVar(t *testing.T) {
	for _, name := range []string{"engine", "engine/3", "grader.v2-a", "x_y"} {
		if got, want := "KILN_SERVICE_"+pipelines.EnvName(name)+"_HOST", pipelines.ServiceHostVar(name); got != want {
			t.Errorf("%s: the job script exports %s, kiln run reads %s", name, got, want)
		}
	}
}
