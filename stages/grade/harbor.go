package grade

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/internal/harbor"
	"github.com/kilnrl/kiln/internal/sandbox"
	"github.com/kilnrl/kiln/internal/shlex"
)

// upload unpacks a packed directory (a tasks version's attachment) at dir
// inside the sandbox, as root, readable by everyone: the tar goes to the
// scratch directory and is removed once unpacked.
func (r *run) upload(ctx context.Context, rel, dir string) error {
	data, ok := r.t.Files[rel]
	if !ok {
		return fmt.Errorf("attachment %q of the tasks version was not loaded", rel)
	}
	tarFile := r.g.scratch("__kiln_harbor_upload__.tar")
	r.sb.step = "upload " + dir
	if err := r.sb.WriteFile(ctx, tarFile, data, 0o600, sandbox.Root); err != nil {
		return fmt.Errorf("writing %s in the sandbox: %w", tarFile, err)
	}
	d := shlex.Quote(dir)
	_, err := r.check(ctx, "upload "+dir, sandbox.Root,
		fmt.Sprintf("rm -rf %s && mkdir -p %s && tar -xf %s -C %s --no-same-owner && rm -f %s && chmod -R a+rX %s",
			d, d, tarFile, d, tarFile, d), userSetupTimeout)
	return err
}

func envList(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// solution runs a Harbor task's oracle in place of a patch
// (docs/data-and-grading.md §7.3): solution/ is uploaded to /solution,
// solve.sh runs in the workdir as root with [solution].env, and /solution
// is removed before the verifier. Its exit status is logged; the verifier
// decides.
func (r *run) solution(ctx context.Context) Outcome {
	h := r.t.Grading.Harbor
	if h == nil || h.Solution == "" {
		return infra(fmt.Errorf("task %q has no Harbor solution/solve.sh to run", r.t.TaskID))
	}
	if err := r.upload(ctx, h.Solution, harbor.SolveDir); err != nil {
		return infra(err)
	}
	r.sb.step = "solution"
	res, err := r.sb.Exec(ctx, sandbox.Cmd{Shell: "cd " + shlex.Quote(r.t.Workdir) + " && bash " + harbor.SolveDir + "/solve.sh",
		User: sandbox.Root, Env: envList(h.SolutionEnv), Timeout: r.g.limit(r.g.Timeout, DefaultTimeout)})
	if err != nil {
		return infra(fmt.Errorf("solution: %w", err))
	}
	if res.TimedOut {
		return Outcome{ExitCode: -1, Failure: records.FailureTimeout, Error: "solution/solve.sh timed out"}
	}
	if _, err := r.check(ctx, "solution_cleanup", sandbox.Root, "rm -rf "+harbor.SolveDir, userSetupTimeout); err != nil {
		return infra(err)
	}
	return Outcome{Applied: true, ExitCode: -1}
}

// harbor runs a Harbor task's verifier (docs/data-and-grading.md §7.3):
// tests/ is uploaded to /tests only now, after the patch; /logs/verifier
// is made fresh and given to the verifier user; tests/test.sh runs in the
// workdir as that user with [verifier].env, under [verifier].timeout_sec
// (else --timeout). The reward is reward.json's metric, else reward.txt's
// number; a verifier that writes neither is no_grading.
func (r *run) harbor(ctx context.Context) Outcome {
	h := r.t.Grading.Harbor
	user := h.VerifierUser
	if user == "" {
		user = sandbox.Root
	}
	if err := r.upload(ctx, h.Tests, harbor.TestsDir); err != nil {
		return infra(err)
	}
	logs := shlex.Quote(harbor.LogsDir)
	if _, err := r.check(ctx, "verifier_logs", sandbox.Root,
		fmt.Sprintf("rm -rf %s && mkdir -p %s && chown %s %s", logs, logs, shlex.Quote(user), logs), userSetupTimeout); err != nil {
		return infra(err)
	}
	timeout := r.g.limit(r.g.Timeout, DefaultTimeout)
	if h.VerifierTimeoutSec > 0 {
		timeout = time.Duration(h.VerifierTimeoutSec * float64(time.Second))
	}
	r.sb.step = "verifier"
	res, err := r.sb.Exec(ctx, sandbox.Cmd{Shell: "cd " + shlex.Quote(r.t.Workdir) + " && bash " + harbor.TestsDir + "/test.sh",
		User: user, Env: envList(h.VerifierEnv), Timeout: timeout})
	if err != nil {
		return infra(fmt.Errorf("verifier: %w", err))
	}
	if res.TimedOut {
		return verdict(res, false)
	}
	reward, err := r.readReward(ctx, h.RewardMetric)
	if err != nil {
		return Outcome{ExitCode: res.ExitCode, Failure: records.FailureNoGrading,
			Error: fmt.Sprintf("tests/test.sh (exit %d): %v", res.ExitCode, err)}
	}
	out := Outcome{Reward: reward, ExitCode: res.ExitCode, Failure: records.FailureTestsFailed}
	if reward == 1 {
		out.Failure = records.FailureNone
	}
	return out
}

// readReward reads reward.json (its metric) or, when there is none,
// reward.txt; each file read is recorded in the grading log.
func (r *run) readReward(ctx context.Context, metric string) (float64, error) {
	if data, err := r.sb.ReadFile(ctx, harbor.RewardJSON); err == nil {
		r.record(map[string]any{"step": "reward.json", "content": string(data)})
		return harbor.RewardFromJSON(data, metric)
	}
	if data, err := r.sb.ReadFile(ctx, harbor.RewardTXT); err == nil {
		r.record(map[string]any{"step": "reward.txt", "content": string(data)})
		return harbor.RewardFromText(data)
	}
	return 0, fmt.Errorf("the verifier wrote neither %s nor %s", harbor.RewardJSON, harbor.RewardTXT)
}
