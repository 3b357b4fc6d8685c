package pipelines

import (
	"log/slog"

	"github.com/kilnrl/kiln/formats/store"
)

// Spec is a parsed pipeline: variables resolved, includes read, step
// patterns not yet expanded (NewPlan does that).
type Spec struct {
	// Path is the file Load read; Name identifies the pipeline in the store
	// (the PIPELINE variable, default the file's base name without .kiln).
	Path, Name string
	// Vars are the final variable values (command line > environment >
	// file), including STEPS when set.
	Vars map[string]string
	// Rules are the target definitions in file order.
	Rules []*Rule
	// origin says where each variable's value came from ("command line",
	// "environment", "file:line").
	origin map[string]string
	vars   *varTable
}

// Rule is one target definition as written: a name that may contain
// $(step) arithmetic, prerequisites, attributes and recipe lines.
type Rule struct {
	Pos     Pos
	Name    string   // unexpanded target name
	Prereqs []string // unexpanded prerequisite names
	Attrs   []Attr   // unexpanded attributes in written order
	Recipe  []string // unexpanded recipe lines (tab stripped)
	// RecipePos are the positions of the recipe lines.
	RecipePos []Pos
	// Step is true for a rule whose name mentions $(step...): it expands
	// once per step 1..STEPS.
	Step bool
}

// Attr is one name=value attribute of a rule.
type Attr struct {
	Pos         Pos
	Name, Value string
}

// Pos is a position in a spec file (1-based line and column).
type Pos struct {
	File      string
	Line, Col int
}

// PlanOptions configure NewPlan.
type PlanOptions struct {
	// Store holds the datasets and the pipeline's record.
	Store store.Store
	// Targets are the goals (default: every target that no other target
	// depends on, i.e. the leaves of the DAG).
	Targets []string
	// Log receives debug lines about each decision (nil: discard).
	Log *slog.Logger
	// NoProbe skips running stages with --print-version when the record has
	// no entry for a key (faster; targets without a record then run).
	NoProbe bool
	// Force marks the named targets not done (kiln verify).
	Force map[string]bool
}

// Plan is the expanded DAG of a spec for a set of goals.
type Plan struct {
	Spec *Spec
	// Targets are the goals and everything they depend on, in topological
	// order (every target after its Deps).
	Targets []*Target

	byName map[string]*Target
	opts   PlanOptions
	rec    *record
}

// Target is one node of the plan.
type Target struct {
	Name string
	// Recipe is the expanded shell lines; refs to prerequisites that are not
	// done yet are ${KILN_REF_n} (see Refs).
	Recipe []string
	// Deps are prerequisite target names (services included).
	Deps []string
	// Attrs are the scheduling attributes.
	Attrs Attrs
	// Key identifies the target's output (see the package doc); "" while a
	// prerequisite is not done.
	Key string
	// Done: the store holds this target's output for Key; Ref names it.
	// Ref is the last ref the recipe printed (a kiln stage's last stdout
	// line): what $(ref T), $< and $^ stand for.
	Done bool
	Ref  string
	// Outputs are every dataset the target wrote, in the order printed
	// (the trailing stdout lines that are refs of Out or of Out/...; a
	// kiln-rollout run writes OUT/rollouts, OUT/turns and
	// OUT/trajectories): what $(ref T NAME) picks from. Ref is the last.
	Outputs []string
	// Why says, when not Done, why it must run (the first difference from
	// the last recorded build), and when Done, what proves it.
	Why string
	// Service targets are started before their users and stopped after.
	Service bool
	// Out is the output dataset name (from --out in the last recipe line,
	// or the out attribute), or "".
	Out string
	// Refs maps each KILN_REF_n placeholder in Recipe to the target whose
	// committed ref it stands for ($(ref T NAME) makes KILN_REF_n_NAME,
	// which stands for T's output NAME).
	Refs map[string]string
	// Step is the step index for step-pattern targets (-1 otherwise).
	Step int
	// Pos is where the rule was written.
	Pos Pos

	// text is the recipe with $(ref X) placeholders (before resolution);
	// rule is the source rule.
	rule     *Rule
	attrText string
	text     []string          // recipe with ${KILN_REF_n} placeholders
	refSel   map[string]string // placeholder -> output NAME of $(ref T NAME)
	used     map[string]string // variables the target's expansion read
	inputs   [][2]string       // prerequisite, identity (set by Resolve)
	recorded *Entry            // the done entry that makes it done (set by Resolve)
}

// Attrs are a target's scheduling attributes. Zero means "not set" (one
// CPU, no GPU, one node, one shard, no throttle, no retries).
type Attrs struct {
	CPUs, GPUs, Nodes, Shards, Throttle, Retries int
	Memory, Time, Partition                      string
	// Health is a service's health-check command: the service is ready when
	// it exits 0.
	Health string
	// Out names the output dataset when the recipe has no --out.
	Out string
	// Every, on a step rule, keeps only the steps that are multiples of it.
	Every int
}
