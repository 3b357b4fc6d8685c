package sync

import (
	"bytes"
	"os"
	"testing"

	"github.com/kilnrl/kiln/internal/stagecmd"
	"github.com/kilnrl/kiln/internal/stagecmd/stagetest"
)

// The test binary doubles as kiln-sync for the crash tests: with
// KILN_TEST_HELPER=1 it runs kiln-sync on its arguments. KILN_TEST_PAUSE_AT
// names a hook point (HookPull*, HookPublish*, the dataset writer's) at
// which it prints "PAUSED <point>" on stderr and waits, for SIGKILL, or
// until the file KILN_TEST_RESUME_FILE appears.
func TestMain(m *testing.M) {
	if os.Getenv("KILN_TEST_HELPER") == "1" {
		env := &stagecmd.Env{Stdout: os.Stdout, Stderr: os.Stderr, Log: stagecmd.NewLogger(os.Stderr, false), Hook: stagetest.PauseHook}
		os.Exit(stagecmd.Main(App(env), append([]string{"kiln-sync"}, os.Args[1:]...), os.Stderr))
	}
	os.Exit(m.Run())
}

// run runs kiln-sync in-process on args, as its main would.
func run(t testing.TB, args ...string) stagetest.Result {
	t.Helper()
	var out, errb bytes.Buffer
	env := &stagecmd.Env{Stdout: &out, Stderr: &errb, Log: stagecmd.NewLogger(&errb, false)}
	code := stagecmd.Main(App(env), append([]string{"kiln-sync"}, args...), &errb)
	return stagetest.Result{Stdout: out.String(), Stderr: errb.String(), Code: code}
}
