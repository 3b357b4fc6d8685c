package datasets_test

import (
	"os"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/kilnrl/kiln/internal/stagecmd"
	"github.com/kilnrl/kiln/internal/stagecmd/stagetest"
	"github.com/kilnrl/kiln/stages/datasets"
)

// The test binary doubles as a kiln writer process for the crash tests:
// with KILN_TEST_HELPER=1 it runs the dataset commands on its arguments.
// KILN_TEST_PAUSE_AT names a writer hook point at which it prints
// "PAUSED <point>" on stderr and waits, for SIGKILL, or until the file
// KILN_TEST_RESUME_FILE appears.
func TestMain(m *testing.M) {
	if os.Getenv("KILN_TEST_HELPER") == "1" {
		env := &datasets.Env{Stdout: os.Stdout, Stderr: os.Stderr, Log: stagecmd.NewLogger(os.Stderr, false), Hook: stagetest.PauseHook}
		os.Exit(stagecmd.Main(newApp(env), append([]string{"kiln"}, os.Args[1:]...), os.Stderr))
	}
	os.Exit(m.Run())
}

func newApp(env *datasets.Env) *cli.App {
	return stagecmd.CommonApp(&cli.App{Name: "kiln", Commands: datasets.Commands(env)}, env.Stdout, env.Stderr)
}

// result is one finished kiln invocation.
type result = stagetest.Result

// kiln runs the dataset commands in-process.
func kiln(t *testing.T, args ...string) result {
	t.Helper()
	return stagetest.Run(t, datasets.Commands, args...)
}
