package slurm

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kilnrl/kiln/fixtures"
	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/internal/agent/enginetest"
	"github.com/kilnrl/kiln/internal/agent/harness"
	"github.com/kilnrl/kiln/internal/sandbox/sandboxtest"
	"github.com/kilnrl/kiln/internal/testenv"
	"github.com/kilnrl/kiln/internal/testenv/gputest"
	"github.com/kilnrl/kiln/internal/testenv/slurmtest"
	"github.com/kilnrl/kiln/pipelines"
)

// TestMiMoSmokeOnSlurm runs the shipped pipelines/mimo-smoke.kiln end to
// end on the one-node test cluster with the real binaries: two fixture
// tasks stand in for the two MiMo tasks, serve.py on the tiny Qwen3
// checkpoint stands in for vLLM (ENGINE_CMD; same reload protocol), the
// real Codex (step 1) and Claude Code (step 2) CLIs run in bwrap
// sandboxes, kiln-train trains on CPU and kiln-sync reloads the engine
// between the steps. The check runs against a scripted policy that fixes
// the tasks (CHECK_ENGINE): the tiny model earns no reward. Step 2's
// rollouts record the weights step 1's sync published (and the engine
// served them: kiln-rollout refuses otherwise), and a second kiln slurm
// submits nothing. Small: 2 samples per task, 2 tokens per model call.
func TestMiMoSmokeOnSlurm(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the whole smoke pipeline on Slurm: agents, a model server, a trainer")
	}
	for _, name := range []string{harness.ClaudeCodeName, harness.CodexName} {
		if _, err := harness.New(name, harness.Options{}); err != nil {
			testenv.SkipOrFail(t, "%s CLI not available (%v): run scripts/install-test-deps.sh", name, err)
		}
	}
	ge := gputest.Find(t)
	sandboxtest.Require(t)
	ctx := context.Background()
	set, err := fixtures.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c := slurmtest.Start(t)
	start := time.Now()
	work := t.TempDir()
	os.Chmod(work, 0o755)

	// Every binary, static, in one directory (kiln-rollout finds kiln-agent
	// and the sandbox helper beside it).
	bin := buildAll(t)
	tiny := longTiny(t, ge)
	tasks := set.Tasks[:2]

	// The check's policy: every session applies its task's gold patch
	// through Codex's shell tool, then answers.
	tok := filepath.Join(work, "check-tokenizer")
	if err := enginetest.WriteTokenizerFiles(tok); err != nil {
		t.Fatal(err)
	}
	one := int64(1) // weights/1: the first number published in a fresh store
	check := httptest.NewServer(enginetest.New(enginetest.Options{Script: fixingPolicy(tasks, false), MaxModelLen: 1 << 16, WeightVersion: &one}))
	t.Cleanup(check.Close)

	home, _ := os.UserHomeDir()
	storeDir := filepath.Join(work, "store")
	runDir := filepath.Join(work, "run")
	file := filepath.Join(work, "mimo-smoke.kiln")
	src, err := os.ReadFile("../mimo-smoke.kiln")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, src, 0o644); err != nil {
		t.Fatal(err)
	}
	vars := []string{
		"MIMO_DATA=" + set.MiMoDir,
		"TASK_IDS=" + tasks[0].ID + "," + tasks[1].ID,
		"IMAGE_SOURCE=" + set.Repository + "=oci:" + set.Layout,
		"BUNDLES=" + filepath.Join(home, ".cache", "kiln", "grade-test-bundles-"+fixtures.GeneratorVersion),
		"MODEL=" + tiny,
		"WEIGHTS_DIR=" + filepath.Join(work, "engine-weights"),
		"ENGINE_CMD=" + ge.Python + " -m kiln_gpu.serve",
		"ENGINE_FLAGS=--max-model-len 65536 --seed 5",
		"ENGINE_PORT=" + strconv.Itoa(freePort(t)),
		"ENGINE_GPUS=0", "TRAIN_GPUS=0", "TRAIN_TIME=",
		"GPU_PARTITION=" + c.Partition, "SANDBOX_PARTITION=" + c.Partition, "SANDBOX_CPUS=1",
		"SAMPLES=2", "ROLLOUT_JOBS=4", "MAX_TOKENS=2", "MAX_TURNS=2", "BUDGET=3m",
		"CHECK_ENGINE=" + check.URL, "CHECK_TOKENIZER=" + tok, "CHECK_MAX_TOKENS=8192",
		"TRAIN_BATCH=4", "LR=5e-2",
	}
	env := append(slices.Clone(c.Env), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"),
		"PYTHONPATH="+ge.Dir, "KILN_GPU_DIR="+ge.Dir, "KILN_PYTHON="+ge.Python)
	kiln := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(filepath.Join(bin, "kiln"), append([]string{"--store", storeDir}, args...)...)
		cmd.Env, cmd.Dir = env, work
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil {
			t.Fatalf("kiln %s: %v\n%s%s\n%s", strings.Join(args, " "), err, out.String(), errb.String(), c.Logs())
		}
		return out.String()
	}
	submitted := func() []string {
		var names []string
		for _, l := range strings.Split(strings.TrimSpace(kiln(append([]string{"slurm", "--dir", runDir, file}, vars...)...)), "\n") {
			if f := strings.Fields(l); len(f) == 2 {
				names = append(names, f[0])
			}
		}
		return names
	}
	if got := submitted(); len(got) != 14 {
		t.Fatalf("kiln slurm submitted %v, want all 14 targets", got)
	}
	deadline := time.Now().Add(15 * time.Minute)
	for {
		out := kiln(append([]string{"status", "--dir", runDir, file}, vars...)...)
		done, failed := 0, ""
		for _, l := range strings.Split(out, "\n")[1:] {
			f := strings.Fields(l)
			switch {
			case len(f) < 2:
			case f[1] == "done":
				done++
			case f[1] == "failed" || f[1] == "cancelled":
				failed += l + "\n"
			}
		}
		if failed != "" {
			logs, _ := exec.Command("sh", "-c", "tail -n 40 "+runDir+"/logs/*.out").CombinedOutput()
			t.Fatalf("kiln status:\n%s\njob logs:\n%s", out, logs)
		}
		if done == 14 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not done after 15 minutes:\n%s", out)
		}
		time.Sleep(2 * time.Second)
	}
	t.Logf("mimo-smoke done on Slurm in %v", time.Since(start).Round(time.Second))
	// The engine service outlives its last user only until its stop job
	// runs: then its job ends and takes its host file with it.
	c.WaitIdle(t, 2*time.Minute)
	stops, _ := filepath.Glob(filepath.Join(runDir, "services", "*.stop"))
	hosts, _ := filepath.Glob(filepath.Join(runDir, "services", "*.host"))
	if len(stops) == 0 || len(hosts) != 0 {
		t.Errorf("after the queue emptied, services holds stop files %q and host files %q: want a stop file per service and no host file", stops, hosts)
	}
	if got := submitted(); len(got) != 0 {
		t.Errorf("a second kiln slurm submitted %v, want nothing", got)
	}

	// Step 2 sampled from what weights/2 published (train/1's checkpoint,
	// weights number 2), with Claude Code; step 1 from weights 1 with Codex.
	st, err := store.Open(storeDir)
	if err != nil {
		t.Fatal(err)
	}
	entry := func(target string) pipelines.Entry {
		t.Helper()
		b, _, err := store.ReadAll(ctx, st, pipelines.RecordPrefix+"mimo-smoke/targets/"+target+".json")
		if err != nil {
			t.Fatalf("%s: no record: %v", target, err)
		}
		var e pipelines.Entry
		if err := json.Unmarshal(b, &e); err != nil {
			t.Fatal(err)
		}
		return e
	}
	for step, agent := range map[int]string{1: harness.CodexName, 2: harness.ClaudeCodeName} {
		w := entry("weights/" + strconv.Itoa(step)).Ref
		wv, err := dataset.OpenString(ctx, st, w)
		if err != nil {
			t.Fatal(err)
		}
		if n := wv.Metrics["weights_number"]; n != float64(step) {
			t.Errorf("weights/%d = %s has weights number %v, want %d", step, w, n, step)
		}
		var rollouts string
		for _, o := range entry("rollout/" + strconv.Itoa(step)).Outputs {
			if strings.Contains(o, "/rollouts@") {
				rollouts = o
			}
		}
		v, err := dataset.OpenString(ctx, st, rollouts)
		if err != nil {
			t.Fatalf("rollout/%d's rollouts %q: %v", step, rollouts, err)
		}
		rows := 0
		if err := v.EachShard(ctx, func(_ int, data []byte) error {
			return records.EachRollout(data, func(r records.Rollout) error {
				rows++
				if r.WeightsVersion != w || r.Agent != agent {
					t.Errorf("step %d: %s sample %d sampled by %s from %q, want %s from %s", step, r.TaskID, r.Sample, r.Agent, r.WeightsVersion, agent, w)
				}
				return nil
			})
		}); err != nil {
			t.Fatal(err)
		}
		if rows != 4 {
			t.Errorf("step %d: %d rollouts, want 2 tasks x 2 samples", step, rows)
		}
	}
	// The check ran as its own job: the planner's --print-version probe
	// of its recipe (kiln-rollout check) names its outputs and runs
	// nothing, so the check is recorded like every target.
	if e := entry("check"); len(e.Outputs) != 4 {
		t.Errorf("check's record names outputs %v, want rollouts, turns, trajectories and grades", e.Outputs)
	}
	if src := entry("weights/2").Inputs; !slices.ContainsFunc(src, func(in [2]string) bool { return in[0] == "train/1" }) {
		t.Errorf("weights/2's inputs %v do not include train/1", src)
	}
}

// fixingPolicy answers every session of the tasks with a shell tool call
// applying the task's gold patch (Codex's exec_command, Claude Code's
// Bash, the shell agent's bash), then a final answer; side requests get
// plain text (the byte-level test tokenizer makes a patch as many tokens
// as bytes: give the engine a large --max-tokens). With firstOnly, only a task's first session fixes it.
func fixingPolicy(tasks []fixtures.Task, firstOnly bool) enginetest.Script {
	var mu sync.Mutex
	applied := map[string]bool{}
	owner := map[string]string{} // task id -> the session that fixes it
	return func(r enginetest.Request) enginetest.Output {
		const final = "<think>\ndone\n</think>\n\nI am done."
		if r.SessionID == "" || strings.Contains(r.PromptText, "<tool_response>") || !strings.Contains(r.PromptText, "<tools>") {
			return enginetest.Output{Text: final}
		}
		for _, task := range tasks {
			first, _, _ := strings.Cut(strings.TrimSpace(task.ProblemStatement), "\n")
			if !strings.Contains(r.PromptText, first) {
				continue
			}
			mu.Lock()
			if owner[task.ID] == "" {
				owner[task.ID] = r.SessionID
			}
			done := applied[r.SessionID] || (firstOnly && owner[task.ID] != r.SessionID)
			applied[r.SessionID] = true
			mu.Unlock()
			if done {
				break
			}
			cmd := "cd " + task.Workdir + " && git apply <<'KILN_EOF'\n" + strings.TrimRight(task.GoldPatch, "\n") + "\nKILN_EOF"
			tool, param := "bash", "command"
			switch {
			case strings.Contains(r.PromptText, "exec_command"):
				tool, param = "exec_command", "cmd"
			case strings.Contains(r.PromptText, `"Bash"`):
				tool = "Bash"
			}
			return enginetest.Output{Text: "<think>\nfixing\n</think>\n\n<tool_call>\n<function=" + tool + ">\n<parameter=" + param + ">\n" + cmd + "\n</parameter>\n</function>\n</tool_call>"}
		}
		return enginetest.Output{Text: final}
	}
}

// freePort is a TCP port free on this host now.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
