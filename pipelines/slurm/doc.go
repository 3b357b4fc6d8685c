// Package slurm compiles a pipeline's targets into sbatch submissions and
// submits them, then exits: no driver process stays alive on the login node
// (docs/design.md §6; issue 23 item 5). Its core (Job, Compile, Submit,
// WriteScripts, Query) depends on nothing of the planner; commands.go adapts
// a plan's targets to Jobs.
//
// # Submission
//
// Jobs are submitted in dependency order with "sbatch --parsable"; the ID it
// prints (before any ";cluster") is the only thing ever read from sbatch's
// output. Each job waits on its prerequisites with
// --dependency=afterok:ID[,afterok:ID...] and is submitted with
// --kill-on-invalid-dep=yes, so when one fails Slurm cancels everything
// downstream (state CANCELLED, reason DependencyNeverSatisfied) instead of
// leaving it pending forever. A failed chain is never revived by Slurm, even
// if the failed job is requeued and succeeds, so a rerun resubmits the
// broken tail: what the store does not hold and Slurm is not still running.
//
// # Arrays
//
// A target with Shards N is one job array, --array=0-(N-1), with %T when
// Throttle T is set; each task sees SLURM_ARRAY_TASK_ID (exported again as
// KILN_SHARD, with KILN_SHARDS=N). A dependency on the array's ID waits for
// every task.
//
// # Multi-node targets
//
// A target with Nodes > 1 gets --nodes=N --ntasks-per-node=1 and its recipe
// runs once per node under srun; KILN_LAUNCH holds the torchrun launcher for
// one rendezvous over the allocation (--nnodes=$SLURM_NNODES
// --nproc-per-node=GPUs --rdzv-backend=c10d with the first host of the node
// list as the endpoint), so a recipe line reads "$KILN_LAUNCH train.py ...".
// GPUs are per node (--gpus-per-node).
//
// # Service targets
//
// A service (an inference engine, a grading server) is a companion job, not
// a heterogeneous job: it waits afterok on its own prerequisites, exports
// KILN_SERVICE_<NAME>_HOST (its node's short hostname; NAME upper-cased,
// other characters '_') and runs its recipe in the background on the node
// Slurm gives it, runs its health command there, where the service is
// reachable (one bound to 127.0.0.1 included), and only once that passes
// writes the hostname to DIR/services/NAME.host (a timeout fails the
// service's job with exit 75 and, through their wait, its users). Its
// users are submitted with --dependency=after:SERVICE_ID (the service has
// started); each waits for the host file (exit 75 past the health timeout)
// and exports KILN_SERVICE_<NAME>_HOST, the address recipes use; the kiln
// run --only in it sees the variable set and neither starts nor checks the
// service itself. A one-line stop job, NAME.stop, compiled and submitted
// like the others (kiln slurm --dry-run writes NAME.stop.sbatch, kiln plan
// --slurm lists it) with --dependency=afterany on all the users, touches
// DIR/services/NAME.stop, and the service job then stops its recipe and
// exits 0. A companion job was chosen over "#SBATCH hetjob" because a
// heterogeneous job's components start together, so the users could not
// wait on their own prerequisites separately, and a service can serve
// users from several steps.
//
// # Completion
//
// A job's script is one line, "kiln --store STORE run FILE --only TARGET
// VAR=..." (an array task adds --shard "$KILN_SHARD"; Options.RunLine can
// replace it): kiln run resolves the prerequisites' refs from the store,
// runs the recipe and records the target done only after it succeeded, so
// the store holds only what succeeded. An array's target is recorded by
// the task that finds every shard's part recorded (pipelines/README.md §7).
// A service's job runs "kiln run --only SERVICE", which keeps the recipe in
// the foreground until the stop file ends it; its users' kiln run finds
// KILN_SERVICE_<NAME>_HOST set and does not start another. A kiln run
// --only whose target fails records the failure in the store (reason and
// output), which kiln status prints beside Slurm's state. "kiln status" reconciles each target from the store first
// (done is done, whatever Slurm says) and then from Slurm: squeue
// --states=all for jobs the controller still holds, sacct for older ones.
package slurm
