// Package pipelines is kiln's pipeline engine (docs/design.md §6): it parses
// Makefile-style specs (*.kiln, the language is pipelines/README.md), expands
// them into a DAG of targets, decides which are done from data versions in
// the store rather than mtimes, and runs the rest locally. pipelines/slurm
// compiles the same Plan into sbatch submissions; kiln's commands over both
// (run, plan, why, verify, slurm, status) are pipelines/pipelinecmd: this
// package has no CLI.
//
// The API other packages build on:
//
//	spec, err := pipelines.Load(path, vars, os.Environ()) // parse + expand variables
//	plan, err := pipelines.NewPlan(ctx, spec, pipelines.PlanOptions{Store: st, Targets: names, Log: log})
//	for _, t := range plan.Targets { ... }                 // topological order, deps first
//	err = plan.MarkDone(ctx, t, ref)                       // record key -> ref in the store
//
// A Target is done when the store's pipeline record holds its Key (see
// Plan.MarkDone), or when the stage its last recipe line runs reports, with
// --print-version, a version the store already holds. Key is the sha256 of
// the target's expanded recipe, its output-affecting attributes and the
// committed refs of its prerequisites; a target whose prerequisite is not
// done yet has Key "" (it cannot be known before the prerequisite commits)
// and Why says which prerequisite it waits for.
//
// Recipes name their inputs with $(ref TARGET) (or $< for the first
// prerequisite, $^ for all): the committed ref of that prerequisite. Before a
// prerequisite is done that ref is unknown, so Target.Recipe holds the shell
// variable ${KILN_REF_n} instead and Target.Refs says which target each
// stands for; an executor that runs targets with no driver (Slurm) runs
// "kiln run FILE --only TARGET" (--shard N for one shard of an array), which
// resolves them from the store at job start and records the result itself
// (pipelines/README.md §7).
package pipelines
