package slurm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/kilnrl/kiln/internal/shlex"
	"github.com/kilnrl/kiln/pipelines"
)

// Job is one sbatch submission: a target of the plan, or a job of any other
// caller. Names are unique within a submission; After names other jobs of
// the same submission (or, for Submit, jobs already in Slurm, see
// SubmitOptions.Live).
type Job struct {
	Name string
	// Script is the bash body the job runs (set -euo pipefail is prepended).
	Script string
	// After lists the jobs that must complete successfully first
	// (afterok); a service among them is waited for by health instead
	// (see doc.go).
	After []string
	// Shards > 0 makes the job an array of Shards tasks, 0..Shards-1; each
	// task sees SLURM_ARRAY_TASK_ID. Throttle > 0 runs at most that many
	// at once (--array=0-(N-1)%T).
	Shards, Throttle        int
	CPUs, GPUs, Nodes       int
	Memory, Time, Partition string
	// Service marks a companion job that runs a long-lived server: it
	// starts once its After jobs are done, is health-checked by Health (a
	// bash command, run by its dependents until it succeeds) and is stopped
	// after its last dependent ends.
	Service bool
	Health  string
}

// Script is a compiled job: the sbatch script text, and the submission's
// dependencies, which are job IDs and so known only at submission time.
type Script struct {
	Name string
	File string // file name within the script directory
	Text string
	// After are the names of the jobs this one waits to succeed; Started
	// the services it waits to start (after:), then for their host files;
	// StopAfter (for a service) the jobs whose end stops it; AfterAny (for
	// a service's stop job, NAME.stop) the jobs it waits to end, however
	// they end (afterany:).
	After, Started, StopAfter, AfterAny []string
}

// stopSuffix names a service's stop job: NAME.stop, file NAME.stop.sbatch.
const stopSuffix = ".stop"

// CompileOptions say where the jobs' files live on the shared filesystem.
type CompileOptions struct {
	// Dir is the run directory, on a filesystem every node sees: logs
	// (Dir/logs), service host files and stop files.
	Dir string
	// HealthTimeout is how long a dependent waits for a service's health,
	// in seconds (default 600).
	HealthTimeout int
}

var nameOK = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._/+=-]*$`)

// FileName is a job's script file name: '/' in a target name (rollout/3)
// becomes '--'.
func FileName(name string) string { return strings.ReplaceAll(name, "/", "--") + ".sbatch" }

// Order checks the jobs (unique names, known dependencies, no cycle) and
// returns them in dependency order, ties broken by input order.
func Order(jobs []Job, known func(string) bool) ([]Job, error) {
	idx := map[string]int{}
	for i, j := range jobs {
		if !nameOK.MatchString(j.Name) {
			return nil, fmt.Errorf("job %q: a name is letters, digits and ._/+=- (rename the target)", j.Name)
		}
		if _, dup := idx[j.Name]; dup {
			return nil, fmt.Errorf("job %q given twice: each target is one job", j.Name)
		}
		if j.Shards < 0 || j.Throttle < 0 || j.CPUs < 0 || j.GPUs < 0 || j.Nodes < 0 {
			return nil, fmt.Errorf("job %q: shards, throttle, cpus, gpus and nodes must not be negative", j.Name)
		}
		if j.Service && j.Shards > 0 {
			return nil, fmt.Errorf("job %q: a service target cannot be sharded", j.Name)
		}
		idx[j.Name] = i
	}
	for _, j := range jobs {
		for _, d := range j.After {
			if _, ok := idx[d]; !ok && (known == nil || !known(d)) {
				return nil, fmt.Errorf("job %q depends on %q, which is not in the submission", j.Name, d)
			}
		}
	}
	state := make([]int, len(jobs)) // 0 new, 1 visiting, 2 done
	var out []Job
	var visit func(i int, path []string) error
	visit = func(i int, path []string) error {
		switch state[i] {
		case 1:
			return fmt.Errorf("dependency cycle: %s -> %s", strings.Join(path, " -> "), jobs[i].Name)
		case 2:
			return nil
		}
		state[i] = 1
		for _, d := range jobs[i].After {
			if k, ok := idx[d]; ok {
				if err := visit(k, append(path, jobs[i].Name)); err != nil {
					return err
				}
			}
		}
		state[i] = 2
		out = append(out, jobs[i])
		return nil
	}
	for i := range jobs {
		if err := visit(i, nil); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// Compile turns jobs into sbatch scripts, in dependency order. known
// reports dependencies outside jobs that Submit will resolve (nil: none).
func Compile(jobs []Job, o CompileOptions) ([]Script, error) {
	return compile(jobs, o, nil)
}

func compile(jobs []Job, o CompileOptions, known func(string) bool) ([]Script, error) {
	ordered, err := Order(jobs, known)
	if err != nil {
		return nil, err
	}
	if o.Dir == "" {
		return nil, errors.New("slurm: CompileOptions.Dir is empty: give the run directory on the shared filesystem")
	}
	if o.HealthTimeout <= 0 {
		o.HealthTimeout = 600
	}
	byName := map[string]Job{}
	for _, j := range jobs {
		byName[j.Name] = j
	}
	users := map[string][]string{}
	for _, j := range ordered {
		for _, d := range j.After {
			if byName[d].Service {
				users[d] = append(users[d], j.Name)
			}
		}
	}
	var out []Script
	for _, j := range ordered {
		s := Script{Name: j.Name, File: FileName(j.Name)}
		for _, d := range j.After {
			if byName[d].Service {
				s.Started = append(s.Started, d)
			} else {
				s.After = append(s.After, d)
			}
		}
		if j.Service {
			s.StopAfter = users[j.Name]
		}
		s.Text = scriptText(j, byName, o)
		out = append(out, s)
	}
	// Each service with users gets a stop job after all of them, last:
	// it is a job of the submission like the others (kiln slurm --dry-run
	// writes it, kiln plan --slurm lists it).
	for _, j := range ordered {
		if !j.Service || len(users[j.Name]) == 0 {
			continue
		}
		name := j.Name + stopSuffix
		if _, clash := byName[name]; clash {
			return nil, fmt.Errorf("job %q: the stop job of service %q has that name: rename the target", name, j.Name)
		}
		out = append(out, Script{Name: name, File: FileName(name), AfterAny: users[j.Name], Text: stopText(j.Name, o)})
	}
	return out, nil
}

// stopText is the stop job of service name: it touches the stop file the
// service's job watches.
func stopText(name string, o CompileOptions) string {
	stopFile := filepath.Join(o.Dir, "services", strings.ReplaceAll(name, "/", "--")+".stop")
	return fmt.Sprintf("#!/bin/bash\n#SBATCH --job-name=%s%s\n#SBATCH --output=/dev/null\nset -euo pipefail\n# after every user of service %s has ended, however it ended\ntouch %s\n",
		name, stopSuffix, name, shlex.Quote(stopFile))
}

func scriptText(j Job, byName map[string]Job, o CompileOptions) string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	w("#!/bin/bash\n")
	w("#SBATCH --job-name=%s\n", j.Name)
	logs := filepath.Join(o.Dir, "logs", strings.ReplaceAll(j.Name, "/", "--"))
	if j.Shards > 0 {
		arr := fmt.Sprintf("0-%d", j.Shards-1)
		if j.Throttle > 0 {
			arr += fmt.Sprintf("%%%d", j.Throttle)
		}
		w("#SBATCH --array=%s\n", arr)
		w("#SBATCH --output=%s-%%A_%%a.out\n", logs)
	} else {
		w("#SBATCH --output=%s-%%j.out\n", logs)
	}
	w("#SBATCH --open-mode=append\n")
	if j.Partition != "" {
		w("#SBATCH --partition=%s\n", j.Partition)
	}
	nodes := max(j.Nodes, 1)
	if j.Nodes > 0 {
		w("#SBATCH --nodes=%d\n", j.Nodes)
	}
	if nodes > 1 {
		w("#SBATCH --ntasks-per-node=1\n")
	}
	if j.CPUs > 0 {
		w("#SBATCH --cpus-per-task=%d\n", j.CPUs)
	}
	if j.Memory != "" {
		w("#SBATCH --mem=%s\n", j.Memory)
	}
	if j.GPUs > 0 {
		// GPUs is per node: every node of a multi-node job trains.
		w("#SBATCH --gpus-per-node=%d\n", j.GPUs)
	}
	if j.Time != "" {
		w("#SBATCH --time=%s\n", j.Time)
	}
	w("set -euo pipefail\n")
	w("export KILN_SLURM_DIR=%s\n", shlex.Quote(o.Dir))
	w("export KILN_TARGET=%s\n", shlex.Quote(j.Name))
	if j.Shards > 0 {
		w("export KILN_SHARD=\"$SLURM_ARRAY_TASK_ID\" KILN_SHARDS=%d\n", j.Shards)
	}
	// Services this job uses: wait until each has published its host,
	// which its own job does once its health check passed on its node.
	for _, d := range j.After {
		svc, ok := byName[d]
		if !ok || !svc.Service {
			continue
		}
		v := pipelines.EnvName(d)
		hostFile := filepath.Join(o.Dir, "services", strings.ReplaceAll(d, "/", "--")+".host")
		w("# service %s: wait for its host file (written once it is healthy)\n", d)
		w("kiln_deadline=$((SECONDS + %d))\n", o.HealthTimeout)
		w("until [ -s %s ]; do (( SECONDS < kiln_deadline )) || { echo \"kiln: service %s not healthy within %ds\" >&2; exit 75; }; sleep 1; done\n", shlex.Quote(hostFile), d, o.HealthTimeout)
		w("export KILN_SERVICE_%s_HOST=\"$(cat %s)\"\n", v, shlex.Quote(hostFile))
	}
	switch {
	case j.Service:
		hostFile := filepath.Join(o.Dir, "services", strings.ReplaceAll(j.Name, "/", "--")+".host")
		stopFile := filepath.Join(o.Dir, "services", strings.ReplaceAll(j.Name, "/", "--")+".stop")
		w("# service: run the recipe in the background on this node, check its health\n# here (where the service is reachable), then publish this node's name for\n# the users; stop when the stop job (after the last user) touches the stop file.\n")
		w("mkdir -p %s\nrm -f %s\n", shlex.Quote(filepath.Dir(hostFile)), shlex.Quote(stopFile))
		w("export KILN_SERVICE_%s_HOST=\"$(hostname -s)\"\n", pipelines.EnvName(j.Name))
		w("( %s\n) &\nkiln_pid=$!\n", body(j.Script))
		if j.Health != "" {
			w("kiln_deadline=$((SECONDS + %d))\n", o.HealthTimeout)
			w("until ( %s ) >/dev/null 2>&1; do\n", j.Health)
			w("\tkill -0 \"$kiln_pid\" 2>/dev/null || { wait \"$kiln_pid\" || true; echo \"kiln: service %s exited before its health check passed\" >&2; exit 1; }\n", j.Name)
			w("\t(( SECONDS < kiln_deadline )) || { echo \"kiln: service %s not healthy within %ds\" >&2; kill \"$kiln_pid\" 2>/dev/null || true; exit 75; }\n", j.Name, o.HealthTimeout)
			w("\tsleep 1\ndone\n")
		}
		w("echo \"$KILN_SERVICE_%s_HOST\" > %s.tmp && mv %s.tmp %s\n", pipelines.EnvName(j.Name), shlex.Quote(hostFile), shlex.Quote(hostFile), shlex.Quote(hostFile))
		w("while [ ! -e %s ]; do\n\tkill -0 \"$kiln_pid\" 2>/dev/null || { wait \"$kiln_pid\"; echo \"kiln: service %s exited before it was stopped\" >&2; exit 1; }\n\tsleep 1\ndone\n", shlex.Quote(stopFile), j.Name)
		w("kill \"$kiln_pid\" 2>/dev/null || true\nwait \"$kiln_pid\" || true\nrm -f %s\n", shlex.Quote(hostFile))
	case nodes > 1:
		// One launcher per node (docs: torchrun pattern A); the recipe
		// uses $KILN_LAUNCH in front of its trainer.
		w("kiln_head=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n1)\n")
		w("export KILN_NNODES=\"$SLURM_NNODES\" KILN_HEAD=\"$kiln_head\"\n")
		w("export KILN_LAUNCH=\"torchrun --nnodes=$SLURM_NNODES --nproc-per-node=%d --rdzv-id=$SLURM_JOB_ID --rdzv-backend=c10d --rdzv-endpoint=$kiln_head:29500\"\n", max(j.GPUs, 1))
		w("srun --nodes=%d --ntasks-per-node=1 bash -euo pipefail -c %s\n", nodes, shlex.Quote(body(j.Script)))
	default:
		w("%s\n", body(j.Script))
	}
	return b.String()
}

func body(s string) string { return strings.TrimRight(s, "\n") }

// WriteScripts writes the compiled scripts into dir (kiln slurm --dry-run)
// and returns them; nothing is submitted. A file "submit.order" lists the
// script files in submission order with their dependencies.
func WriteScripts(dir string, jobs []Job, o CompileOptions) ([]Script, error) {
	if o.Dir == "" {
		o.Dir = dir
	}
	scripts, err := Compile(jobs, o)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("creating the script directory %q: %w", dir, err)
	}
	var order strings.Builder
	for _, s := range scripts {
		if err := os.WriteFile(filepath.Join(dir, s.File), []byte(s.Text), 0o644); err != nil {
			return nil, fmt.Errorf("writing %q: %w", s.File, err)
		}
		fmt.Fprintf(&order, "%s", s.File)
		if len(s.After) > 0 {
			fmt.Fprintf(&order, " afterok=%s", strings.Join(s.After, ","))
		}
		if len(s.Started) > 0 {
			fmt.Fprintf(&order, " after=%s", strings.Join(s.Started, ","))
		}
		if len(s.AfterAny) > 0 {
			fmt.Fprintf(&order, " afterany=%s", strings.Join(s.AfterAny, ","))
		}
		order.WriteString("\n")
	}
	if err := os.WriteFile(filepath.Join(dir, "submit.order"), []byte(order.String()), 0o644); err != nil {
		return nil, fmt.Errorf("writing %q: %w", "submit.order", err)
	}
	return scripts, nil
}

// SubmitOptions configure Submit.
type SubmitOptions struct {
	CompileOptions
	// Env is the environment of sbatch (nil: this process's).
	Env []string
	// Sbatch is the sbatch command (default "sbatch").
	Sbatch string
	// Live maps dependencies outside the submission that are still queued or
	// running to their Slurm job IDs; the new jobs wait on them. A
	// dependency neither submitted now nor in Live is taken as done.
	Live map[string]string
}

// Submit compiles the jobs, writes their scripts into Dir/scripts and
// submits them with sbatch in dependency order, each with
// --dependency=afterok on the IDs of its prerequisites and
// --kill-on-invalid-dep=yes, so a failure cancels the jobs downstream
// instead of leaving them pending. It returns each job's Slurm ID. Only the
// --parsable output is read from sbatch: the ID, before any ";cluster".
// On an error the IDs submitted so far are returned with it.
func Submit(ctx context.Context, jobs []Job, o SubmitOptions) (map[string]string, error) {
	scripts, err := compile(jobs, o.CompileOptions, func(n string) bool { return true })
	if err != nil {
		return nil, err
	}
	sbatch := o.Sbatch
	if sbatch == "" {
		sbatch = "sbatch"
	}
	for _, sub := range []string{"scripts", "logs", "services"} {
		if err := os.MkdirAll(filepath.Join(o.Dir, sub), 0o755); err != nil {
			return nil, fmt.Errorf("creating the run directory %q: %w", o.Dir, err)
		}
	}
	byName := map[string]Job{}
	for _, j := range jobs {
		byName[j.Name] = j
	}
	ids := map[string]string{}
	idOf := func(n string) string {
		if id, ok := ids[n]; ok {
			return id
		}
		return o.Live[n]
	}
	for _, s := range scripts {
		if byName[s.Name].Service {
			// A host file left by an earlier run must not be read as
			// this one's.
			os.Remove(filepath.Join(o.Dir, "services", strings.ReplaceAll(s.Name, "/", "--")+".host"))
		}
		path := filepath.Join(o.Dir, "scripts", s.File)
		if err := os.WriteFile(path, []byte(s.Text), 0o755); err != nil {
			return ids, fmt.Errorf("writing %q: %w", path, err)
		}
		var deps []string
		for _, d := range s.After {
			if id := idOf(d); id != "" {
				deps = append(deps, "afterok:"+id)
			}
		}
		for _, d := range s.Started {
			if id := idOf(d); id != "" {
				deps = append(deps, "after:"+id)
			}
		}
		// A stop job waits for every user to end, however it ends.
		var anyIDs []string
		for _, d := range s.AfterAny {
			if id := idOf(d); id != "" {
				anyIDs = append(anyIDs, id)
			}
		}
		if len(anyIDs) > 0 {
			deps = append(deps, "afterany:"+strings.Join(anyIDs, ":"))
		}
		args := []string{"--parsable", "--kill-on-invalid-dep=yes"}
		if len(deps) > 0 {
			args = append(args, "--dependency="+strings.Join(deps, ","))
		}
		args = append(args, path)
		id, err := runSbatch(ctx, sbatch, args, o.Env)
		if err != nil {
			return ids, fmt.Errorf("submitting %q: %w", s.Name, err)
		}
		ids[s.Name] = id
	}
	return ids, nil
}

func runSbatch(ctx context.Context, sbatch string, args, env []string) (string, error) {
	cmd := exec.CommandContext(ctx, sbatch, args...)
	cmd.Env = env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%s: %w: %s", sbatch, err, strings.TrimSpace(stderr.String()))
	}
	return ParseParsable(stdout.String())
}

var jobIDRe = regexp.MustCompile(`^[0-9]+$`)

// ParseParsable reads sbatch --parsable output: "ID" or "ID;cluster".
func ParseParsable(out string) (string, error) {
	line := strings.TrimSpace(out)
	if i := strings.LastIndexByte(line, '\n'); i >= 0 {
		line = strings.TrimSpace(line[i+1:])
	}
	id, _, _ := strings.Cut(line, ";")
	if !jobIDRe.MatchString(id) {
		return "", fmt.Errorf("sbatch --parsable printed %q, not a job ID", strings.TrimSpace(out))
	}
	return id, nil
}

// State is what Slurm says of one job (an array: of all its tasks).
type State struct {
	// State is a Slurm job state (PENDING, RUNNING, COMPLETED, FAILED,
	// CANCELLED, TIMEOUT, ...), or UNKNOWN when neither squeue nor sacct
	// knows the job.
	State  string
	Reason string
	// Tasks maps array task IDs to their states (arrays only).
	Tasks map[int]string
}

// Active reports whether the job may still run: pending, running,
// completing, suspended or requeued.
func (s State) Active() bool {
	switch s.State {
	case "PENDING", "RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "REQUEUED", "RESIZING", "SIGNALING", "STAGE_OUT", "REQUEUE_HOLD", "REQUEUE_FED":
		return true
	}
	return false
}

// QueryOptions configure Query.
type QueryOptions struct {
	Env []string
	// Squeue and Sacct are the commands (defaults "squeue", "sacct").
	Squeue, Sacct string
}

// Query reads the state of each job ID from squeue --states=all (jobs the
// controller still holds, MinJobAge after they end), then sacct for the
// rest (when accounting is on). An array's state is the worst of its
// tasks': any failed task fails it, else any active task keeps it active.
func Query(ctx context.Context, ids []string, o QueryOptions) (map[string]State, error) {
	if o.Squeue == "" {
		o.Squeue = "squeue"
	}
	if o.Sacct == "" {
		o.Sacct = "sacct"
	}
	rows := map[string][][2]string{} // job id -> (task or "", state|reason)
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	add := func(jobid, state, reason string) {
		base, task, _ := strings.Cut(jobid, "_")
		if !want[base] {
			return
		}
		state, _, _ = strings.Cut(state, " ") // "CANCELLED by 0"
		rows[base] = append(rows[base], [2]string{task, state + "|" + reason})
	}
	if len(ids) > 0 {
		out, err := run(ctx, o.Env, o.Squeue, "--states=all", "-h", "-r", "-o", "%i|%T|%r", "-j", strings.Join(ids, ","))
		if err != nil {
			// An ID the controller has forgotten fails the whole call:
			// ask one at a time.
			out = nil
			for _, id := range ids {
				one, err := run(ctx, o.Env, o.Squeue, "--states=all", "-h", "-r", "-o", "%i|%T|%r", "-j", id)
				if err == nil {
					out = append(out, one...)
				}
			}
		}
		for _, line := range strings.Split(string(out), "\n") {
			f := strings.Split(strings.TrimSpace(line), "|")
			if len(f) == 3 {
				add(f[0], f[1], f[2])
			}
		}
	}
	var missing []string
	for _, id := range ids {
		if len(rows[id]) == 0 {
			missing = append(missing, id)
		}
	}
	if len(missing) > 0 {
		if out, err := run(ctx, o.Env, o.Sacct, "-X", "-n", "-P", "-o", "JobID,State,Reason", "-j", strings.Join(missing, ",")); err == nil {
			for _, line := range strings.Split(string(out), "\n") {
				f := strings.Split(strings.TrimSpace(line), "|")
				if len(f) == 3 {
					add(f[0], f[1], f[2])
				}
			}
		}
	}
	res := map[string]State{}
	for _, id := range ids {
		r := rows[id]
		if len(r) == 0 {
			res[id] = State{State: "UNKNOWN"}
			continue
		}
		st := State{}
		active, failed, done := "", "", 0
		for _, row := range r {
			state, reason, _ := strings.Cut(row[1], "|")
			if row[0] != "" {
				if st.Tasks == nil {
					st.Tasks = map[int]string{}
				}
				if n, err := strconv.Atoi(row[0]); err == nil {
					st.Tasks[n] = state
				}
			}
			s := State{State: state}
			switch {
			case s.Active():
				if active == "" || state == "RUNNING" {
					active, st.Reason = state, reason
				}
			case state == "COMPLETED":
				done++
			default:
				if failed == "" {
					failed, st.Reason = state, reason
				}
			}
		}
		switch {
		case failed != "":
			st.State = failed
		case active != "":
			st.State = active
		default:
			st.State, st.Reason = "COMPLETED", ""
		}
		res[id] = st
	}
	return res, nil
}

func run(ctx context.Context, env []string, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = env
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// sortedKeys is the keys of m in order.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
