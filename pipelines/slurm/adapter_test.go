package slurm

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/kilnrl/kiln/internal/stagecmd"
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
	app := env.App(&cli.App{Name: "kiln", Commands: Commands(env, Options{Plan: PipelinePlanner(env), Kiln: "/opt/kiln"})})
	dry := filepath.Join(dir, "dry")
	args := []string{"kiln", "--store", filepath.Join(dir, "store"), "slurm", file, "N=3", "--dry-run", dry}
	if code := stagecmd.Main(app, args, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	order, err := os.ReadFile(filepath.Join(dry, "submit.order"))
	if err != nil {
		t.Fatal(err)
	}
	want := "data.sbatch\nengine.sbatch afterok=data\nshards.sbatch afterok=data after=engine\nfinal.sbatch afterok=shards\n"
	if string(order) != want {
		t.Errorf("submit.order:\n%s\nwant:\n%s", order, want)
	}
	sh, _ := os.ReadFile(filepath.Join(dry, "shards.sbatch"))
	for _, w := range []string{"#SBATCH --array=0-2%2\n", "#SBATCH --cpus-per-task=1\n", `/opt/kiln --store ` + filepath.Join(dir, "store") + ` run ` + file + ` --only shards --shard "$KILN_SHARD" N=3`} {
		if !strings.Contains(string(sh), w) {
			t.Errorf("shards.sbatch lacks %q:\n%s", w, sh)
		}
	}
}
