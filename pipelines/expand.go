package pipelines

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// maxSteps bounds STEPS (a typo should not plan a billion targets).
const maxSteps = 1_000_000

// expandTargets expands every rule (step rules once per step 1..STEPS)
// into targets. order is the targets in file order.
func expandTargets(spec *Spec) (map[string]*Target, []string, error) {
	vt := spec.vars
	steps := -1
	all := map[string]*Target{}
	explicit := map[string]bool{}
	var order []string
	skipped, err := everySkipped(spec)
	if err != nil {
		return nil, nil, err
	}
	// explicit rules first: they win over a step pattern's instance.
	for pass := 0; pass < 2; pass++ {
		for _, r := range spec.Rules {
			if r.Step != (pass == 1) {
				continue
			}
			lo, hi := -1, -1
			if r.Step {
				if steps < 0 {
					d, ok := vt.defs["STEPS"]
					if !ok {
						return nil, nil, errAt(r.Pos, "step target %q needs STEPS (STEPS = N, or STEPS=N on the command line)", r.Name)
					}
					v, err := vt.expand(d.value, nil, d.pos)
					if err != nil {
						return nil, nil, err
					}
					n, err := strconv.Atoi(strings.TrimSpace(v))
					if err != nil || n < 0 || n > maxSteps {
						return nil, nil, errAt(r.Pos, "STEPS = %q (%s): want a whole number from 0 to %d", v, d.origin, maxSteps)
					}
					steps = n
				}
				lo, hi = 1, steps
			}
			for step := lo; step <= hi; step++ {
				if !r.Step && step > -1 {
					break
				}
				if r.Step && skipped[stepName{r, step}] {
					continue // every=N leaves this step out
				}
				t, err := expandRule(vt, r, step, skipped)
				if err != nil {
					return nil, nil, err
				}
				if prev := all[t.Name]; prev != nil {
					if r.Step && explicit[t.Name] {
						continue // the explicit rule (e.g. a base case) wins
					}
					return nil, nil, errAt(r.Pos, "target %q defined twice (first at %s:%d)", t.Name, prev.Pos.File, prev.Pos.Line)
				}
				all[t.Name] = t
				explicit[t.Name] = !r.Step
				order = append(order, t.Name)
			}
		}
	}
	for _, name := range order {
		t := all[name]
		for _, d := range t.Deps {
			dt := all[d]
			if dt == nil {
				return nil, nil, errAt(t.Pos, "no rule for %q, a prerequisite of %s", d, t.Name)
			}
		}
	}
	// file order: explicit and step rules interleave as written
	sort.SliceStable(order, func(i, j int) bool {
		a, b := all[order[i]], all[order[j]]
		if a.Pos.File != b.Pos.File {
			return false
		}
		return a.Pos.Line < b.Pos.Line
	})
	return all, order, nil
}

// stepName is one step rule's instance.
type stepName struct {
	r    *Rule
	step int
}

// everySkipped finds the step instances an every=N attribute leaves out
// (steps that are not multiples of N), keyed by rule and step and by
// name: a prerequisite naming a left-out instance is dropped (so
// "eval/$(step-1)" means "eval/(step-1) if there is one"); a name an
// explicit rule defines is never left out.
func everySkipped(spec *Spec) (map[any]bool, error) {
	skipped := map[any]bool{}
	vt := spec.vars
	explicit := map[string]bool{}
	uses := false
	for _, r := range spec.Rules {
		for _, a := range r.Attrs {
			uses = uses || a.Name == "every"
		}
		if !r.Step {
			if n, err := vt.expand(r.Name, &scope{step: -1, used: map[string]string{}}, r.Pos); err == nil {
				explicit[n] = true
			}
		}
	}
	if !uses {
		return skipped, nil
	}
	steps := 0
	if d, ok := vt.defs["STEPS"]; ok {
		v, err := vt.expand(d.value, nil, d.pos)
		if err != nil {
			return nil, err
		}
		steps, _ = strconv.Atoi(strings.TrimSpace(v))
		steps = min(max(steps, 0), maxSteps)
	}
	for _, r := range spec.Rules {
		for _, a := range r.Attrs {
			if a.Name != "every" {
				continue
			}
			if !r.Step {
				return nil, errAt(a.Pos, "every= on %s, which is not a step rule (its target does not mention $(step))", r.Name)
			}
			for step := 1; step <= steps; step++ {
				sc := &scope{step: step, used: map[string]string{}}
				v, err := vt.expand(a.Value, sc, a.Pos)
				if err != nil {
					return nil, err
				}
				n, err := strconv.Atoi(strings.TrimSpace(v))
				if err != nil || n < 1 {
					return nil, errAt(a.Pos, "attribute every=%q: want a whole number >= 1", v)
				}
				if step%n == 0 {
					continue
				}
				name, err := vt.expand(r.Name, sc, r.Pos)
				if err != nil {
					return nil, err
				}
				if !explicit[name] {
					skipped[stepName{r, step}], skipped[name] = true, true
				}
			}
		}
	}
	return skipped, nil
}

func expandRule(vt *varTable, r *Rule, step int, skipped map[any]bool) (*Target, error) {
	sc := &scope{step: step, used: map[string]string{}}
	name, err := vt.expand(r.Name, sc, r.Pos)
	if err != nil {
		return nil, err
	}
	if !nameRe.MatchString(name) || strings.Contains(name, "//") || strings.HasSuffix(name, "/") {
		return nil, errAt(r.Pos, "target name %q: want letters, digits, '.', '_', '-' and '/'", name)
	}
	t := &Target{Name: name, Step: step, Pos: r.Pos, rule: r}
	var attrText []string
	for _, a := range r.Attrs {
		v, err := vt.expand(a.Value, sc, a.Pos)
		if err != nil {
			return nil, err
		}
		num := func() (int, error) {
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 {
				return 0, errAt(a.Pos, "attribute %s=%q: want a whole number >= 0", a.Name, v)
			}
			return n, nil
		}
		var n int
		switch a.Name {
		case "cpus", "gpus", "nodes", "shards", "throttle", "retries":
			if n, err = num(); err != nil {
				return nil, err
			}
		}
		switch a.Name {
		case "cpus":
			t.Attrs.CPUs = n
		case "gpus":
			t.Attrs.GPUs = n
		case "nodes":
			t.Attrs.Nodes = n
		case "shards":
			t.Attrs.Shards = n
			attrText = append(attrText, "shards="+v)
		case "throttle":
			t.Attrs.Throttle = n
		case "retries":
			t.Attrs.Retries = n
		case "memory":
			t.Attrs.Memory = v
		case "time":
			t.Attrs.Time = v
		case "partition":
			t.Attrs.Partition = v
		case "health":
			t.Attrs.Health = v
		case "service":
			t.Service = v == "true" || v == "1" || v == "yes"
		case "out":
			t.Attrs.Out = v
			attrText = append(attrText, "out="+v)
		case "every":
			// which steps have an instance (everySkipped); not the output's
			// business, so not in the key
			if t.Attrs.Every, err = num(); err != nil {
				return nil, err
			}
		}
	}
	t.attrText = strings.Join(attrText, " ")
	if t.Attrs.Health != "" && !t.Service {
		return nil, errAt(r.Pos, "target %s has health= but is not a service: add service to its attributes", name)
	}
	for _, p := range r.Prereqs {
		v, err := vt.expand(p, sc, r.Pos)
		if err != nil {
			return nil, err
		}
		for _, f := range strings.Fields(v) {
			if skipped[f] {
				continue // an instance every=N left out
			}
			if f == name {
				return nil, errAt(r.Pos, "target %s depends on itself", name)
			}
			dup := false
			for _, d := range t.Deps {
				dup = dup || d == f
			}
			if !dup {
				t.Deps = append(t.Deps, f)
			}
		}
	}
	sc.inRule, sc.target, sc.prereqs, sc.shards = true, name, t.Deps, max(t.Attrs.Shards, 1)
	var refErr error
	sc.refs = func(dep, sel string) string {
		for i, d := range t.Deps {
			if d != dep {
				continue
			}
			ph := "KILN_REF_" + strconv.Itoa(i)
			if sel != "" {
				ph += "_" + EnvName(sel)
				if old, ok := t.refSel[ph]; ok && old != sel && refErr == nil {
					refErr = fmt.Errorf("$(ref %s %s) and $(ref %s %s) name outputs too alike (both are %s): name them apart", dep, old, dep, sel, ph)
				}
				if t.refSel == nil {
					t.refSel = map[string]string{}
				}
				t.refSel[ph] = sel
			}
			if t.Refs == nil {
				t.Refs = map[string]string{}
			}
			t.Refs[ph] = d
			return "${" + ph + "}"
		}
		if refErr == nil {
			refErr = fmt.Errorf("$(ref %s): %s is not a prerequisite of %s (add it after the colon)", dep, dep, name)
		}
		return ""
	}
	for i, l := range r.Recipe {
		v, err := vt.expand(l, sc, r.RecipePos[i])
		if err != nil {
			return nil, err
		}
		if refErr != nil {
			return nil, errAt(r.RecipePos[i], "%v", refErr)
		}
		t.text = append(t.text, v)
	}
	t.Recipe = t.text
	t.used = sc.used
	t.Out = t.Attrs.Out
	if t.Out == "" && len(t.text) > 0 {
		t.Out = outFlag(t.text[len(t.text)-1])
	}
	if t.Service && t.Attrs.Shards > 1 {
		return nil, errAt(r.Pos, "service %s cannot have shards", name)
	}
	return t, nil
}

// outFlag is NAME in a line's "--out NAME" or "--out=NAME".
func outFlag(line string) string {
	f := strings.Fields(line)
	for i, w := range f {
		if w == "--out" && i+1 < len(f) {
			return f[i+1]
		}
		if v, ok := strings.CutPrefix(w, "--out="); ok {
			return v
		}
	}
	return ""
}

// EnvName is a name as part of an environment variable: upper case, every
// character but a letter or a digit as '_' (KILN_SERVICE_<NAME>_HOST,
// KILN_REF_n_<NAME>). pipelines/slurm spells service names the same way.
func EnvName(s string) string {
	var b strings.Builder
	for _, r := range strings.ToUpper(s) {
		if (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	return b.String()
}

// ServiceHostVar is the environment variable that holds service name's
// host for its users: KILN_SERVICE_<NAME>_HOST (pipelines/README.md §4).
func ServiceHostVar(name string) string { return "KILN_SERVICE_" + EnvName(name) + "_HOST" }
