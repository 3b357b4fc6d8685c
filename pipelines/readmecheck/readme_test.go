// Package readmecheck checks the pipeline example of pipelines/README.md
// against the stages' real command lines: it is a separate package so
// that the engine's own tests do not build every stage.
package readmecheck

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/internal/stagecmd"
	"github.com/kilnrl/kiln/pipelines"
	"github.com/kilnrl/kiln/stages/advantages"
	"github.com/kilnrl/kiln/stages/grade"
	"github.com/kilnrl/kiln/stages/rollout"
	"github.com/kilnrl/kiln/stages/train"
)

// apps are the stages the example may run, by binary name.
func apps(env *stagecmd.Env) map[string]*cli.App {
	return map[string]*cli.App{
		"kiln-rollout":    rollout.App(env),
		"kiln-grade":      grade.App(env),
		"kiln-advantages": advantages.App(env),
		"kiln-train":      train.App(env),
	}
}

var makeBlock = regexp.MustCompile("(?s)```make\n(.*?)```")

// TestREADMEExample expands the README's example for two steps (every
// $(ref ...) resolved as for a plan) and checks that each kiln-* recipe
// line names a real (sub)command and only flags that command has.
// (Issue 32: the example used --weights on kiln-train, --part, --rollouts
// and --init, which no stage has.)
func TestREADMEExample(t *testing.T) {
	src, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	m := makeBlock.FindSubmatch(src)
	if m == nil {
		t.Fatal("pipelines/README.md has no ```make example")
	}
	file := filepath.Join(t.TempDir(), "rl.kiln")
	if err := os.WriteFile(file, m[1], 0o644); err != nil {
		t.Fatal(err)
	}
	spec, err := pipelines.Load(file, map[string]string{"STEPS": "2"}, nil)
	if err != nil {
		t.Fatalf("the README's example does not parse: %v", err)
	}
	st, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	plan, err := pipelines.NewPlan(context.Background(), spec, pipelines.PlanOptions{Store: st, NoProbe: true})
	if err != nil {
		t.Fatalf("the README's example does not plan: %v", err)
	}
	env := &stagecmd.Env{Stdout: io.Discard, Stderr: io.Discard, Log: stagecmd.NewLogger(io.Discard, false)}
	bins := apps(env)
	checked := map[string]bool{}
	for _, tg := range plan.Targets {
		for _, line := range tg.Recipe {
			words := strings.Fields(line)
			if len(words) == 0 || !strings.HasPrefix(words[0], "kiln-") {
				continue
			}
			app := bins[words[0]]
			if app == nil {
				t.Errorf("%s: %s is not a stage this test knows: add it to apps", tg.Name, words[0])
				continue
			}
			checked[words[0]] = true
			flags := names(app.Flags)
			cmds := app.Commands
			for _, w := range words[1:] {
				if strings.HasPrefix(w, "-") {
					name := strings.TrimLeft(w, "-")
					name, _, _ = strings.Cut(name, "=")
					if !flags[name] {
						t.Errorf("%s: %s has no flag --%s (%s)", tg.Name, words[0], name, line)
					}
					continue
				}
				for _, c := range cmds {
					if c.Name == w {
						for k := range names(c.Flags) {
							flags[k] = true
						}
						cmds = c.Subcommands
						break
					}
				}
			}
		}
	}
	for _, b := range []string{"kiln-rollout", "kiln-grade", "kiln-advantages", "kiln-train"} {
		if !checked[b] {
			t.Errorf("the example runs no %s: the check would not catch its flags", b)
		}
	}
}

func names(fs []cli.Flag) map[string]bool {
	m := map[string]bool{"help": true, "h": true}
	for _, f := range fs {
		for _, n := range f.Names() {
			m[n] = true
		}
	}
	return m
}
