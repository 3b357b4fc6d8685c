package pipelines

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/store"
)

// RecordPrefix is where pipelines keep their records in the store:
// RecordPrefix + NAME + "/" holds done/KEY.json (one per built key),
// targets/TARGET.json (the last build of each target, for "why"),
// logs/TARGET/KEY.log and lock.json. Dataset names cannot start with "_",
// so no dataset collides with it, and kiln gc leaves it alone.
const RecordPrefix = "_pipelines/"

// keyVersion changes when the key's inputs change meaning.
const keyVersion = "kiln-pipeline-key/1"

// Entry is one recorded build of a target.
type Entry struct {
	Target string `json:"target"`
	Key    string `json:"key"`
	Ref    string `json:"ref"`
	// Outputs are every ref the build printed (Ref is the last); absent
	// in entries written before targets had several outputs: then [Ref].
	Outputs []string          `json:"outputs,omitempty"`
	Inputs  [][2]string       `json:"inputs"` // prerequisite, its ref (or key:KEY)
	Vars    map[string]string `json:"vars"`
	Recipe  []string          `json:"recipe"`
	Attrs   string            `json:"attrs"`
	Start   time.Time         `json:"start"`
	End     time.Time         `json:"end"`
	Host    string            `json:"host,omitempty"`
	PID     int               `json:"pid,omitempty"`
	Log     string            `json:"log,omitempty"` // store key of the output log
}

type record struct {
	st     store.Store
	prefix string
	mu     sync.Mutex
	keys   map[string]bool
}

func (r *record) doneKey(key string) string { return r.prefix + "done/" + key + ".json" }
func (r *record) lastKey(t string) string   { return r.prefix + "targets/" + t + ".json" }
func (r *record) failedKey(t string) string { return r.prefix + "failed/" + t + ".json" }

func (r *record) read(ctx context.Context, key string) (*Entry, error) {
	b, _, err := store.ReadAll(ctx, r.st, key)
	if err != nil {
		return nil, err
	}
	var e Entry
	if err := json.Unmarshal(b, &e); err != nil {
		return nil, fmt.Errorf("pipeline record %q in %s is corrupt (%v): remove it and the target reruns", key, r.st.URI(), err)
	}
	return &e, nil
}

// write records e as done, then as its target's last build. Done goes
// first: a crash between the two leaves the target done with an older last
// entry (or none), which the next kiln run rewrites (see Plan.settleLast).
func (r *record) write(ctx context.Context, e *Entry) error {
	if err := r.put(ctx, r.doneKey(e.Key), e); err != nil {
		return fmt.Errorf("recording %s as done in %s: %w", e.Target, r.st.URI(), err)
	}
	r.mu.Lock()
	r.keys[e.Key] = true
	r.mu.Unlock()
	return r.writeLast(ctx, e)
}

func (r *record) writeLast(ctx context.Context, e *Entry) error {
	if err := r.put(ctx, r.lastKey(e.Target), e); err != nil {
		return fmt.Errorf("recording %s in %s: %w", e.Target, r.st.URI(), err)
	}
	return nil
}

func (r *record) put(ctx context.Context, key string, e *Entry) error {
	b, err := json.MarshalIndent(e, "", "  ")
	if err != nil {
		return err
	}
	_, err = r.st.Put(ctx, key, bytes.NewReader(b), int64(len(b)))
	return err
}

// settleLast rewrites t's last entry from the done entry Resolve found
// for it when that one is newer. Only a run killed between record.write's
// two Puts leaves that state; left alone, the target's last build would be
// missing from the record, and kiln why would word its next answer from
// an older build.
func (p *Plan) settleLast(ctx context.Context, t *Target) error {
	e := t.recorded
	if e == nil {
		return nil
	}
	last, err := p.Last(ctx, t.Name)
	if err != nil {
		return err
	}
	if last != nil && !last.End.Before(e.End) {
		return nil
	}
	return p.rec.writeLast(ctx, e)
}

// Entry reads the recorded build of key, or nil when none is recorded.
func (p *Plan) Entry(ctx context.Context, key string) (*Entry, error) {
	p.rec.mu.Lock()
	ok := p.rec.keys[key]
	p.rec.mu.Unlock()
	if !ok {
		return nil, nil
	}
	e, err := p.rec.read(ctx, p.rec.doneKey(key))
	if errors.Is(err, store.ErrNotExist) {
		return nil, nil
	}
	return e, err
}

// Last reads the last recorded build of target, or nil.
func (p *Plan) Last(ctx context.Context, target string) (*Entry, error) {
	e, err := p.rec.read(ctx, p.rec.lastKey(target))
	if errors.Is(err, store.ErrNotExist) {
		return nil, nil
	}
	return e, err
}

// Target returns the named target of the plan, or nil.
func (p *Plan) Target(name string) *Target { return p.byName[name] }

// Store is the plan's store.
func (p *Plan) Store() store.Store { return p.opts.Store }

// NewPlan expands spec into the DAG for o.Targets and decides, in
// topological order, which targets are done. It reads the store and runs
// one-line kiln-stage recipes with --print-version; it writes nothing.
func NewPlan(ctx context.Context, spec *Spec, o PlanOptions) (*Plan, error) {
	if o.Store == nil {
		return nil, errors.New("plan: no store")
	}
	if o.Log == nil {
		o.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	all, order, err := expandTargets(spec)
	if err != nil {
		return nil, err
	}
	p := &Plan{Spec: spec, byName: all, opts: o,
		rec: &record{st: o.Store, prefix: RecordPrefix + spec.Name + "/", keys: map[string]bool{}}}
	goals := o.Targets
	if len(goals) == 0 {
		goals = order
	}
	// topological order by DFS from the goals
	const (
		white = iota
		grey
		black
	)
	color := make(map[string]int, len(all))
	var stack []string
	var visit func(name string) error
	visit = func(name string) error {
		t := all[name]
		switch color[name] {
		case black:
			return nil
		case grey:
			i := len(stack) - 1
			for stack[i] != name {
				i--
			}
			cyc := append(append([]string{}, stack[i:]...), name)
			return errAt(t.Pos, "dependency cycle: %s", strings.Join(cyc, " -> "))
		}
		color[name] = grey
		stack = append(stack, name)
		for _, d := range t.Deps {
			if err := visit(d); err != nil {
				return err
			}
		}
		stack = stack[:len(stack)-1]
		color[name] = black
		p.Targets = append(p.Targets, t)
		return nil
	}
	for _, g := range goals {
		if all[g] == nil {
			return nil, fmt.Errorf("no target %q in %s (kiln plan %s lists them)", g, spec.Path, spec.Path)
		}
		if err := visit(g); err != nil {
			return nil, err
		}
	}
	if err := o.Store.List(ctx, p.rec.prefix+"done/", func(info store.Info) error {
		k := strings.TrimSuffix(strings.TrimPrefix(info.Key, p.rec.prefix+"done/"), ".json")
		p.rec.keys[k] = true
		return nil
	}); err != nil {
		return nil, fmt.Errorf("reading pipeline record %s in %s: %w", p.rec.prefix, o.Store.URI(), err)
	}
	for _, t := range p.Targets {
		if t.Service {
			continue
		}
		if err := p.Resolve(ctx, t); err != nil {
			return nil, err
		}
	}
	p.settleServices()
	return p, nil
}

// settleServices marks a service done when none of its users runs.
func (p *Plan) settleServices() {
	users := map[string][]*Target{}
	for _, t := range p.Targets {
		for _, d := range t.Deps {
			if p.byName[d].Service {
				users[d] = append(users[d], t)
			}
		}
	}
	for _, t := range p.Targets {
		if !t.Service {
			continue
		}
		t.Done, t.Why = true, "no target that uses it runs"
		for _, u := range users[t.Name] {
			if !u.Done {
				t.Done, t.Why = false, "started for "+u.Name
				break
			}
		}
	}
}

// Identity is what a prerequisite contributes to its users' keys: its
// refs (all of its outputs, space-separated, when it has several), or its
// key when it writes no dataset.
func (t *Target) Identity() string {
	if len(t.Outputs) > 1 {
		return strings.Join(t.Outputs, " ")
	}
	if t.Ref != "" {
		return t.Ref
	}
	return "key:" + t.Key
}

// refValue is what $(ref T) (sel "") or $(ref T NAME) stands for once T is
// done: T's ref (its last output; key:KEY without one), or its output
// named NAME or OUT/NAME.
func refValue(t *Target, sel string) (string, error) {
	if sel == "" {
		if t.Ref != "" {
			return t.Ref, nil
		}
		return "key:" + t.Key, nil
	}
	outs := t.Outputs
	if len(outs) == 0 && t.Ref != "" {
		outs = []string{t.Ref}
	}
	for _, o := range outs {
		name, _, _ := strings.Cut(o, "@")
		if name == sel || (t.Out != "" && name == t.Out+"/"+sel) {
			return o, nil
		}
	}
	if len(outs) == 0 {
		return "", fmt.Errorf("$(ref %s %s): %s wrote no dataset: write $(ref %s), or give it --out", t.Name, sel, t.Name, t.Name)
	}
	return "", fmt.Errorf("$(ref %s %s): %s has no output %q; its outputs are %s: name one of those (the part after %s/)", t.Name, sel, t.Name, sel, strings.Join(outs, ", "), t.Out)
}

// substitute is t's recipe with each placeholder replaced by the ref it
// stands for; every prerequisite it names must be done.
func (p *Plan) substitute(t *Target) ([]string, error) {
	recipe := make([]string, len(t.text))
	copy(recipe, t.text)
	for ph, d := range t.Refs {
		v, err := refValue(p.byName[d], t.refSel[ph])
		if err != nil {
			return nil, errAt(t.Pos, "target %s: %v", t.Name, err)
		}
		for j := range recipe {
			recipe[j] = strings.ReplaceAll(recipe[j], "${"+ph+"}", v)
		}
	}
	return recipe, nil
}

// resolveService substitutes the refs of service t's recipe once its
// prerequisites are done (a service has no key and is never recorded).
func (p *Plan) resolveService(t *Target) error {
	for _, d := range t.Deps {
		if dt := p.byName[d]; !dt.Service && !dt.Done {
			return fmt.Errorf("service %s: prerequisite %s is not done (%s): it runs first", t.Name, d, dt.Why)
		}
	}
	recipe, err := p.substitute(t)
	if err != nil {
		return err
	}
	t.Recipe = recipe
	return nil
}

// Resolve (re)decides t from its prerequisites' current state: once they
// are all done, it substitutes their refs into Recipe, computes Key and
// looks it up. Executors call it when a target's prerequisites finish.
func (p *Plan) Resolve(ctx context.Context, t *Target) error {
	t.Done, t.Ref, t.Outputs, t.Key, t.recorded = false, "", nil, "", nil
	for _, d := range t.Deps {
		dt := p.byName[d]
		if dt.Service {
			continue
		}
		if !dt.Done {
			t.Why = "prerequisite " + d + " runs first"
			t.Recipe = t.text
			return nil
		}
	}
	var inputs [][2]string
	for i := range t.Deps {
		dt := p.byName[t.Deps[i]]
		if dt.Service {
			continue
		}
		inputs = append(inputs, [2]string{dt.Name, dt.Identity()})
	}
	recipe, err := p.substitute(t)
	if err != nil {
		return err
	}
	t.Recipe = recipe
	t.inputs = inputs
	h := sha256.New()
	io.WriteString(h, keyVersion+"\n")
	for _, l := range recipe {
		io.WriteString(h, "recipe "+l+"\n")
	}
	io.WriteString(h, "attrs "+t.attrText+"\n")
	for _, in := range inputs {
		io.WriteString(h, "input "+in[0]+"="+in[1]+"\n")
	}
	t.Key = hex.EncodeToString(h.Sum(nil))
	if p.opts.Force[t.Name] {
		t.Why = "forced"
		return nil
	}
	e, err := p.Entry(ctx, t.Key)
	if err != nil {
		return err
	}
	if e != nil {
		t.Done, t.Ref, t.Outputs, t.recorded = true, e.Ref, e.Outputs, e
		if len(t.Outputs) == 0 && e.Ref != "" {
			t.Outputs = []string{e.Ref}
		}
		t.Why = "recorded: built " + e.End.UTC().Format(time.RFC3339)
		if e.Ref != "" {
			t.Why += " as " + e.Ref
		}
		return nil
	}
	if outs, ok := p.probe(ctx, t); ok {
		t.Done, t.Ref, t.Outputs = true, outs[len(outs)-1], outs
		t.Why = "the store holds " + strings.Join(outs, ", ") + " (--print-version)"
		return nil
	}
	last, err := p.Last(ctx, t.Name)
	if err != nil {
		return err
	}
	t.Why = why(t, last)
	return nil
}

// why names the first difference between t and its last recorded build.
func why(t *Target, last *Entry) string {
	if last == nil {
		return "never built"
	}
	names := make([]string, 0, len(t.used))
	for k := range t.used {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		if old, ok := last.Vars[k]; ok && old != t.used[k] {
			return fmt.Sprintf("variable %s changed: %q -> %q", k, old, t.used[k])
		}
	}
	old := map[string]string{}
	for _, in := range last.Inputs {
		old[in[0]] = in[1]
	}
	for _, in := range t.inputs {
		if o, ok := old[in[0]]; !ok {
			return "new prerequisite " + in[0]
		} else if o != in[1] {
			return fmt.Sprintf("input %s changed: %s -> %s", in[0], o, in[1])
		}
	}
	for i := 0; i < max(len(last.Recipe), len(t.Recipe)); i++ {
		var a, b string
		if i < len(last.Recipe) {
			a = last.Recipe[i]
		}
		if i < len(t.Recipe) {
			b = t.Recipe[i]
		}
		if a != b {
			return fmt.Sprintf("recipe line %d changed: %q -> %q", i+1, a, b)
		}
	}
	if last.Attrs != t.attrText {
		return fmt.Sprintf("attributes changed: %q -> %q", last.Attrs, t.attrText)
	}
	return "its output is not recorded for key " + t.Key[:12]
}

// probe asks a one-line kiln-stage recipe, with --print-version, which
// versions it would write, and reports whether the store holds them all.
// It reads the printed refs with the rule that reads a build's (outputs),
// so kiln plan and kiln run agree on what the target writes.
func (p *Plan) probe(ctx context.Context, t *Target) ([]string, bool) {
	if p.opts.NoProbe || t.Out == "" || len(t.Recipe) != 1 || t.Attrs.Shards > 1 {
		return nil, false
	}
	f := strings.Fields(t.Recipe[0])
	if len(f) == 0 || (f[0] != "kiln" && !strings.HasPrefix(filepath.Base(f[0]), "kiln-")) {
		return nil, false
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "sh", "-c", t.Recipe[0]+" --print-version")
	cmd.Dir = filepath.Dir(p.Spec.Path)
	cmd.Env = append(os.Environ(), "KILN_STORE="+p.opts.Store.URI())
	var out bytes.Buffer
	cmd.Stdout = &out
	if err := cmd.Run(); err != nil {
		p.opts.Log.Debug("probe failed; the target runs", "target", t.Name, "err", err)
		return nil, false
	}
	outs, err := outputs(out.String(), t.Out)
	if err != nil || len(outs) == 0 {
		p.opts.Log.Debug("probe printed no output of the target; it runs", "target", t.Name, "err", err)
		return nil, false
	}
	for _, o := range outs {
		r, _ := dataset.ParseRef(o)
		if _, err := dataset.Open(ctx, p.opts.Store, r); err != nil {
			return nil, false
		}
	}
	return outs, true
}

// outputs reads the refs a recipe printed (pipelines/README.md §3): with
// an output dataset OUT, the trailing stdout lines that are pinned refs of
// OUT or of OUT/... (a stage with several outputs prints one a line, its
// committed refs last), in printed order; the last line must be one. With
// no OUT, the last line when it is a pinned ref, else none.
func outputs(stdout, out string) ([]string, error) {
	lines := strings.Split(strings.TrimRight(stdout, "\r\n"), "\n")
	if out == "" {
		if r, err := dataset.ParseRef(strings.TrimSpace(lines[len(lines)-1])); err == nil && r.Pinned() {
			return []string{r.String()}, nil
		}
		return nil, nil
	}
	var outs []string
	for i := len(lines) - 1; i >= 0; i-- {
		r, err := dataset.ParseRef(strings.TrimSpace(lines[i]))
		if err != nil || !r.Pinned() || (r.Name != out && !strings.HasPrefix(r.Name, out+"/")) {
			break
		}
		outs = append([]string{r.String()}, outs...)
	}
	if len(outs) == 0 {
		return nil, fmt.Errorf("the recipe's last stdout line %q is not a ref of %s or %s/... (name@version): the writing command must come last", strings.TrimSpace(lines[len(lines)-1]), out, out)
	}
	return outs, nil
}

// MarkDone records t as built with ref (its output's committed ref, or ""
// for a target without an output dataset): key -> ref in the store.
func (p *Plan) MarkDone(ctx context.Context, t *Target, ref string) error {
	now := time.Now()
	return p.MarkDoneRun(ctx, t, ref, RunInfo{Start: now, End: now})
}

// RunInfo is what an executor knows about one build.
type RunInfo struct {
	Start, End time.Time
	Log        string // store key of the kept output
	// Outputs are every ref the build printed, ref last (nil: [ref]).
	Outputs []string
}

// MarkDoneRun is MarkDone with the run's times and log.
func (p *Plan) MarkDoneRun(ctx context.Context, t *Target, ref string, ri RunInfo) error {
	if t.Key == "" {
		return fmt.Errorf("mark %s done: its prerequisites are not all done (call Resolve after they finish)", t.Name)
	}
	host, _ := os.Hostname()
	outs := ri.Outputs
	if len(outs) == 0 && ref != "" {
		outs = []string{ref}
	}
	e := &Entry{Target: t.Name, Key: t.Key, Ref: ref, Outputs: outs, Inputs: t.inputs, Vars: t.used, Recipe: t.Recipe,
		Attrs: t.attrText, Start: ri.Start, End: ri.End, Host: host, PID: os.Getpid(), Log: ri.Log}
	if err := p.rec.write(ctx, e); err != nil {
		return err
	}
	// A failure recorded before this build is no longer the target's state.
	if err := p.opts.Store.Delete(ctx, p.rec.failedKey(t.Name)); err != nil && !errors.Is(err, store.ErrNotExist) {
		p.opts.Log.Warn("removing the target's old failure record failed", "target", t.Name, "err", err)
	}
	t.Done, t.Ref, t.Outputs, t.Why = true, ref, outs, "built"
	return nil
}

// Failure is the record of a target's last failed build, kept at
// failed/TARGET.json in the pipeline's record until a build of it
// succeeds: kiln why and kiln status print it.
type Failure struct {
	Target string `json:"target"`
	Key    string `json:"key,omitempty"`
	// Reason is the error the build ended with (an exit status, a service
	// that never became healthy, a lost lock...).
	Reason string `json:"reason"`
	// Log is the store key of the build's kept output ("" when none ran).
	Log   string    `json:"log,omitempty"`
	Start time.Time `json:"start"`
	End   time.Time `json:"end"`
	Host  string    `json:"host,omitempty"`
	PID   int       `json:"pid,omitempty"`
}

// LastFailure reads target's failure record, or nil when its last build
// did not fail (or it never ran).
func (p *Plan) LastFailure(ctx context.Context, target string) (*Failure, error) {
	b, _, err := store.ReadAll(ctx, p.opts.Store, p.rec.failedKey(target))
	if errors.Is(err, store.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the failure record of %s in %s: %w", target, p.opts.Store.URI(), err)
	}
	var f Failure
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("failure record %q in %s is corrupt (%v): remove it", p.rec.failedKey(target), p.opts.Store.URI(), err)
	}
	return &f, nil
}

// recordFailure keeps why t failed and where its output is. It runs after
// the build's context may have ended (a lost lock, Ctrl-C), so it does not
// use it for the write.
func (p *Plan) recordFailure(ctx context.Context, t *Target, reason, log string, start time.Time) {
	host, _ := os.Hostname()
	f := Failure{Target: t.Name, Key: t.Key, Reason: reason, Log: log, Start: start, End: time.Now(), Host: host, PID: os.Getpid()}
	b, _ := json.MarshalIndent(f, "", "  ")
	if _, err := p.opts.Store.Put(context.WithoutCancel(ctx), p.rec.failedKey(t.Name), bytes.NewReader(b), int64(len(b))); err != nil {
		p.opts.Log.Warn("recording the target's failure failed", "target", t.Name, "err", err)
	}
}
