package pipelinecmd

import (
	"context"
	"os"

	"github.com/urfave/cli/v2"

	"github.com/kilnrl/kiln/internal/stagecmd"
	"github.com/kilnrl/kiln/pipelines"
	"github.com/kilnrl/kiln/pipelines/slurm"
)

// planner is kiln slurm's, kiln status's and kiln plan --slurm's planner:
// pipelines.Load, then NewPlan on the store --store names (created when
// local and missing: the jobs write into it), adapted to slurm.Target.
func planner(env *stagecmd.Env) slurm.Planner {
	return func(ctx context.Context, c *cli.Context, file string, goals []string, vars map[string]string) ([]slurm.Target, error) {
		spec, err := pipelines.Load(file, vars, os.Environ())
		if err != nil {
			return nil, err
		}
		st, err := stagecmd.OpenStore(c)
		if err != nil {
			return nil, err
		}
		plan, err := pipelines.NewPlan(ctx, spec, pipelines.PlanOptions{Store: st, Targets: goals, Log: env.Log})
		if err != nil {
			return nil, err
		}
		out := make([]slurm.Target, 0, len(plan.Targets))
		for _, t := range plan.Targets {
			a := t.Attrs
			if a.Shards <= 1 {
				a.Shards = 0 // one shard is a plain job, as kiln run treats it
			}
			out = append(out, slurm.Target{
				Name: t.Name, Deps: t.Deps, Done: t.Done, Why: t.Why, Service: t.Service, Health: a.Health,
				Shards: a.Shards, Throttle: a.Throttle, CPUs: a.CPUs, GPUs: a.GPUs, Nodes: a.Nodes,
				Memory: a.Memory, Time: a.Time, Partition: a.Partition, Step: t.Step,
				Describe: func(ctx context.Context, metrics bool) (slurm.Details, error) {
					return describe(ctx, plan, t, metrics)
				},
			})
		}
		return out, nil
	}
}

// describe adapts the plan's summary of t to what kiln status prints.
func describe(ctx context.Context, plan *pipelines.Plan, t *pipelines.Target, metrics bool) (slurm.Details, error) {
	s, err := plan.Summary(ctx, t, metrics)
	if err != nil {
		return slurm.Details{}, err
	}
	d := slurm.Details{Ref: s.Ref, WallSeconds: s.WallSeconds}
	for _, o := range s.Outputs {
		d.Outputs = append(d.Outputs, slurm.Output{Ref: o.Ref, Rows: o.Rows, Metrics: o.Metrics})
	}
	if s.Failure != nil {
		d.Failure, d.FailureLog = s.Failure.Reason, s.Failure.Log
	}
	return d, nil
}
