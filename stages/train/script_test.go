package train

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/rogpeppe/go-internal/testscript"

	"github.com/kilnrl/kiln/internal/stagecmd"
)

// TestMain makes the test binary kiln-train too, for the scripts.
func TestMain(m *testing.M) {
	testscript.Main(m, map[string]func(){
		"kiln-train": func() { os.Exit(stagecmd.Run(App)) },
	})
}

// TestScript runs testdata/script/*.txtar: kiln-train's --help, its usage
// errors and --dry-run as a person sees them, from the binary. The command
// "world" writes the unit tests' fixture (a store with trajectories and
// their advantages, a model directory) and sets STORE, TRAJ, ADV, MODEL.
func TestScript(t *testing.T) {
	fake, err := filepath.Abs(filepath.Join("testdata", "fakegpu"))
	if err != nil {
		t.Fatal(err)
	}
	testscript.Run(t, testscript.Params{
		Dir: "testdata/script",
		Setup: func(e *testscript.Env) error {
			e.Setenv("FAKE_GPU", fake)
			return nil
		},
		Cmds: map[string]func(ts *testscript.TestScript, neg bool, args []string){
			"world": func(ts *testscript.TestScript, neg bool, args []string) {
				w := newWorld(t)
				ts.Setenv("STORE", w.st.Root())
				ts.Setenv("TRAJ", w.trajectories.String())
				ts.Setenv("ADV", w.advantages.String())
				ts.Setenv("OTHER_ADV", w.other.String())
				ts.Setenv("MODEL", w.model)
			},
		},
	})
}
