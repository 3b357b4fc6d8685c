package pipelines

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/kilnrl/kiln/formats/store"
)

var update = flag.Bool("update", false, "rewrite golden files")

// TestParseErrors: every malformed spec is refused with file:line:col and
// the offending text (golden: testdata/errors.golden).
func TestParseErrors(t *testing.T) {
	cases := []struct{ name, src string }{
		{"recipe before target", "\techo hi\n"},
		{"spaces for tab", "a:\n    echo hi\n"},
		{"no colon", "just words\n"},
		{"unclosed paren in recipe", "a:\n\techo $(FOO\n"},
		{"unknown attribute", "a: [cpu=2]\n"},
		{"attribute without value", "a: [cpus]\n"},
		{"unclosed attributes", "a: [cpus=2\n"},
		{"bad number", "a: [cpus=two]\n"},
		{"undefined variable", "a:\n\techo $(NOPE)\n"},
		{"step outside step target", "a: b/$(step)\n"},
		{"step without STEPS", "r/$(step):\n"},
		{"bad STEPS", "STEPS = many\nr/$(step):\n"},
		{"missing prerequisite", "a: b\n"},
		{"duplicate target", "a:\na:\n"},
		{"cycle", "a: b\nb: a\n"},
		{"ref of non-prerequisite", "a:\nb:\n\techo $(ref a)\n"},
		{"health without service", "a: [health=true]\n"},
		{"self dependency", "a: a\n"},
		{"recursive variable", "X = $(X)\na:\n\techo $(X)\n"},
		{"bad target name", "a b: c\n"},
		{"include missing", "include nothere.kiln\n"},
	}
	var golden strings.Builder
	for _, c := range cases {
		_, err := plan(t, c.src, nil)
		if err == nil {
			t.Errorf("%s: no error", c.name)
			continue
		}
		fmt.Fprintf(&golden, "%s\n\t%s\n", c.name, err.Error())
	}
	got := golden.String()
	path := "testdata/errors.golden"
	if *update {
		os.WriteFile(path, []byte(got), 0o644)
	}
	want, _ := os.ReadFile(path)
	if got != string(want) {
		t.Errorf("errors differ from %s (go test -run TestParseErrors -update):\n%s", path, got)
	}
}

func plan(t testing.TB, src string, vars map[string]string) (*Plan, error) {
	spec, err := Parse("p.kiln", []byte(src), vars, nil)
	if err != nil {
		return nil, err
	}
	st, err := store.Open(t.(interface{ TempDir() string }).TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return NewPlan(context.Background(), spec, PlanOptions{Store: st, NoProbe: true})
}

func TestPrecedence(t *testing.T) {
	src := "A ?= file\nB = file\nC ?= file\nx:\n\techo $(A) $(B) $(C) $(D)\n"
	spec, err := Parse("p.kiln", []byte(src), map[string]string{"C": "cmd"}, []string{"A=env", "B=env", "C=env", "D=env"})
	if err != nil {
		t.Fatal(err)
	}
	st, _ := store.Open(t.TempDir())
	p, err := NewPlan(context.Background(), spec, PlanOptions{Store: st, NoProbe: true})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := p.Target("x").Recipe[0], "echo env file cmd env"; got != want {
		t.Errorf("recipe %q, want %q (command line > environment > ?=; = beats the environment)", got, want)
	}
}

func TestStepExpansion(t *testing.T) {
	src := `STEPS = 3
STALENESS ?= 1
AGENT = a
AGENT.2 = b
train/0:
	echo base
rollout/$(step): [shards=2 gpus=1] train/$(step-1-$(STALENESS))
	run --agent $(AGENT.$(step)) --weights $< --part $(shard)/$(shards) --out rollouts/$(step)
train/$(step): rollout/$(step) train/$(step-1)
	train $(ref rollout/$(step)) $@
srv: [service health="true"]
	serve
`
	p, err := plan(t, src, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tg := range p.Targets {
		names = append(names, tg.Name)
	}
	if got := strings.Join(names, " "); got != "train/0 rollout/1 rollout/2 train/1 rollout/3 train/2 train/3 srv" {
		t.Errorf("order %s", got)
	}
	r2 := p.Target("rollout/2")
	if r2.Deps[0] != "train/0" || r2.Attrs.Shards != 2 || r2.Attrs.GPUs != 1 || r2.Out != "rollouts/2" {
		t.Errorf("rollout/2 = %+v", r2)
	}
	if got := r2.Recipe[0]; got != "run --agent b --weights ${KILN_REF_0} --part ${KILN_SHARD}/2 --out rollouts/2" {
		t.Errorf("rollout/2 recipe %q", got)
	}
	if !p.Target("srv").Service || p.Target("srv").Attrs.Health != "true" {
		t.Errorf("srv not a service")
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{"", "a:\n\techo\n", "S = 2\nr/$(step): r/$(step-1)\n", "a: [cpus=1 health=\"x y\"]\n"} {
		f.Add(s)
	}
	if b, err := os.ReadFile("testdata/rl.kiln"); err == nil {
		f.Add(string(b))
	}
	f.Fuzz(func(t *testing.T, src string) {
		spec, err := Parse("f.kiln", []byte(src), map[string]string{"STEPS": "3"}, nil)
		if err != nil {
			return
		}
		st, _ := store.Open(t.TempDir())
		_, _ = NewPlan(context.Background(), spec, PlanOptions{Store: st, NoProbe: true})
	})
}

// BenchmarkPlan plans an RL pipeline of steps x 10 targets and reports the
// growth from 1,000 to 10,000 targets (goal: linear, under 1 s).
func BenchmarkPlan(b *testing.B) {
	gen := func(steps int) string {
		var s strings.Builder
		fmt.Fprintf(&s, "STEPS = %d\nt0/0:\n\techo base\n", steps)
		for i := 0; i < 10; i++ {
			prev := fmt.Sprintf("t%d/$(step)", i-1)
			if i == 0 {
				prev = "t9/$(step-1)"
			}
			fmt.Fprintf(&s, "t%d/$(step): [cpus=2] %s\n\tstage-%d --in $< --out d%d/$(step)\n", i, prev, i, i)
		}
		s.WriteString("t9/0: t0/0\n\techo base9\n")
		return s.String()
	}
	sizes := []int{100, 1000}
	if testing.Short() {
		sizes = []int{10, 100}
	}
	var ns [2]float64
	var bytesPer [2]float64
	for i, steps := range sizes {
		src := gen(steps)
		b.Run(fmt.Sprintf("targets=%d", steps*10), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := plan(b, src, nil); err != nil {
					b.Fatal(err)
				}
			}
			ns[i] = float64(b.Elapsed().Nanoseconds()) / float64(b.N)
		})
		_ = bytesPer
	}
	if ns[0] > 0 {
		b.ReportMetric(ns[1]/ns[0], "growth_x10")
	}
}

// BenchmarkPlanDone plans the same pipelines when every target is done
// (each key computed and found in the record: the rerun-nothing case).
func BenchmarkPlanDone(b *testing.B) {
	sizes := []int{100, 1000}
	if testing.Short() {
		sizes = []int{10, 100}
	}
	for _, steps := range sizes {
		var s strings.Builder
		fmt.Fprintf(&s, "STEPS = %d\nt0/0:\n\techo base\nt9/0: t0/0\n\techo base9\n", steps)
		for i := 0; i < 10; i++ {
			prev := fmt.Sprintf("t%d/$(step)", i-1)
			if i == 0 {
				prev = "t9/$(step-1)"
			}
			fmt.Fprintf(&s, "t%d/$(step): [cpus=2] %s\n\tstage-%d --in $< --out d%d/$(step)\n", i, prev, i, i)
		}
		spec, err := Parse("p.kiln", []byte(s.String()), nil, nil)
		if err != nil {
			b.Fatal(err)
		}
		st, _ := store.Open(b.TempDir())
		ctx := context.Background()
		p, err := NewPlan(ctx, spec, PlanOptions{Store: st, NoProbe: true})
		if err != nil {
			b.Fatal(err)
		}
		for _, t := range p.Targets {
			if err := p.Resolve(ctx, t); err != nil {
				b.Fatal(err)
			}
			if err := p.MarkDone(ctx, t, ""); err != nil {
				b.Fatal(err)
			}
		}
		b.Run(fmt.Sprintf("targets=%d", steps*10+2), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				p, err := NewPlan(ctx, spec, PlanOptions{Store: st, NoProbe: true})
				if err != nil {
					b.Fatal(err)
				}
				if last := p.Targets[len(p.Targets)-1]; !last.Done {
					b.Fatalf("%s not done: %s", last.Name, last.Why)
				}
			}
		})
	}
}
