package main

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/rogpeppe/go-internal/testscript"

	"github.com/kilnrl/kiln/fixtures"
	"github.com/kilnrl/kiln/internal/sandbox/sandboxtest"
	"github.com/kilnrl/kiln/internal/stagecmd"
	"github.com/kilnrl/kiln/stages/advantages"
	"github.com/kilnrl/kiln/stages/convert"
	"github.com/kilnrl/kiln/stages/grade"
	"github.com/kilnrl/kiln/stages/images"
	"github.com/kilnrl/kiln/stages/rollout"
)

// TestMain makes this test binary every kiln binary as well, so the
// scripts run kiln, kiln-convert, ... by name (testscript puts them on
// PATH), and kiln dispatches to the others as it does when installed.
func TestMain(m *testing.M) {
	testscript.Main(m, map[string]func(){
		"kiln":            func() { os.Exit(run()) },
		"kiln-convert":    func() { os.Exit(stagecmd.Run(convert.App)) },
		"kiln-images":     func() { os.Exit(stagecmd.Run(images.App)) },
		"kiln-grade":      func() { os.Exit(stagecmd.Run(grade.App)) },
		"kiln-rollout":    func() { os.Exit(stagecmd.Run(rollout.App)) },
		"kiln-advantages": func() { os.Exit(stagecmd.Run(advantages.App)) },
	})
}

// TestScript runs testdata/script/*.txtar: the dataset commands, the
// README's examples, help and every class of usage error. Each script
// starts in an empty $WORK, with $REPO the repository root.
func TestScript(t *testing.T) {
	testscript.Run(t, scriptParams(t, "testdata/script", nil))
}

// TestScriptPipeline runs testdata/pipeline/*.txtar: the fixtures through
// kiln convert, kiln images and kiln grade in real bwrap sandboxes. It
// needs root, bubblewrap and the fixtures (make deps): without them it
// skips, and fails under CI=true.
func TestScriptPipeline(t *testing.T) {
	sandboxtest.Require(t)
	set, err := fixtures.Load(context.Background())
	if err != nil {
		t.Fatalf("fixtures: %v (make deps builds them)", err)
	}
	helper := t.TempDir()
	if _, err := sandboxtest.BuildHelper(helper); err != nil {
		t.Fatal(err)
	}
	home, err := os.UserHomeDir()
	if err != nil {
		t.Fatal(err)
	}
	testscript.Run(t, scriptParams(t, "testdata/pipeline", func(e *testscript.Env) error {
		e.Setenv("PATH", helper+string(os.PathListSeparator)+e.Getenv("PATH"))
		e.Setenv("FIXTURES_MIMO", set.MiMoDir)
		e.Setenv("FIXTURES_OCI", set.Layout)
		e.Setenv("FIXTURES_REPOSITORY", set.Repository)
		e.Setenv("FIXTURES_GOLD", set.GoldPatches)
		e.Setenv("FIXTURES_SWEBENCH", set.SWEBenchJSONL)
		e.Setenv("FIXTURES_SWEPRO", set.SWEProJSONL)
		e.Setenv("FIXTURES_SWEPRO_SCRIPTS", set.SWEProScripts)
		e.Setenv("FIXTURES_F2P", set.F2PJSONL)
		// Bundles are reused across runs, as in stages/grade's end-to-end
		// test: unpacking the base layer takes a while.
		e.Setenv("BUNDLES", filepath.Join(home, ".cache", "kiln", "grade-test-bundles-"+fixtures.GeneratorVersion))
		return nil
	}))
}

func scriptParams(t *testing.T, dir string, setup func(*testscript.Env) error) testscript.Params {
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return testscript.Params{
		Dir: dir,
		Setup: func(e *testscript.Env) error {
			e.Setenv("REPO", repo)
			vars := e.Vars[:0]
			for _, kv := range e.Vars {
				if !strings.HasPrefix(kv, "KILN_") { // the scripts set what they use
					vars = append(vars, kv)
				}
			}
			e.Vars = vars
			if setup != nil {
				return setup(e)
			}
			return nil
		},
		Cmds: map[string]func(ts *testscript.TestScript, neg bool, args []string){"status": cmdStatus},
	}
}

// cmdStatus is "status N COMMAND [ARGS...]": run the command and check
// that it exits with status N (its output is stdout and stderr for the
// next commands, as exec's).
func cmdStatus(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) < 2 {
		ts.Fatalf("usage: status N COMMAND [ARGS...]")
	}
	want, err := strconv.Atoi(args[0])
	if err != nil {
		ts.Fatalf("status: %q is not an exit status", args[0])
	}
	err = ts.Exec(args[1], args[2:]...)
	got := 0
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		got = ee.ExitCode()
	case err != nil:
		ts.Fatalf("status: %v", err)
	}
	if got != want {
		ts.Fatalf("%s exited %d, want %d", args[1], got, want)
	}
}
