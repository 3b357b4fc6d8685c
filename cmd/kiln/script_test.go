package main

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/klauspost/compress/zstd"
	"github.com/rogpeppe/go-internal/testscript"
	"github.com/rogpeppe/go-internal/txtar"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/urfave/cli/v2"

	"github.com/kilnrl/kiln/fixtures"
	"github.com/kilnrl/kiln/internal/sandbox/sandboxtest"
	"github.com/kilnrl/kiln/internal/stagecmd"
	"github.com/kilnrl/kiln/stages/advantages"
	"github.com/kilnrl/kiln/stages/convert"
	"github.com/kilnrl/kiln/stages/grade"
	"github.com/kilnrl/kiln/stages/images"
	"github.com/kilnrl/kiln/stages/rollout"
	kilnsync "github.com/kilnrl/kiln/stages/sync"
	"github.com/kilnrl/kiln/stages/sync/synctest"
	"github.com/kilnrl/kiln/stages/train"
)

// TestMain makes this test binary every kiln binary as well, so the
// scripts run kiln, kiln-convert, ... by name (testscript puts them on
// PATH), and kiln dispatches to the others as it does when installed.
func TestMain(m *testing.M) {
	testscript.Main(m, map[string]func(){
		"kiln":            func() { os.Exit(run()) },
		"kiln-convert":    func() { os.Exit(stagecmd.Run(convert.App)) },
		"kiln-images":     func() { os.Exit(stagecmd.Run(images.App)) },
		"kiln-grade":      func() { os.Exit(stagecmd.Run(grade.App)) },
		"kiln-rollout":    func() { os.Exit(stagecmd.Run(rollout.App)) },
		"kiln-advantages": func() { os.Exit(stagecmd.Run(advantages.App)) },
		"kiln-train":      func() { os.Exit(stagecmd.Run(train.App)) },
		"kiln-sync":       func() { os.Exit(stagecmd.Run(kilnsync.App)) },
	})
}

// TestScript runs testdata/script/*.txtar: the dataset commands, the
// README's examples, every --help example (help_examples), help, every
// class of usage error, and SIGINT/SIGTERM to running writers (signals).
// Each script starts in an empty $WORK, with $REPO the repository root;
// scriptCmds lists the commands they have beyond testscript's.
func TestScript(t *testing.T) {
	testscript.Run(t, scriptParams(t, "testdata/script", nil))
}

// TestScriptPipeline runs testdata/pipeline/*.txtar: the fixtures through
// kiln convert, kiln images and kiln grade in real bwrap sandboxes. It
// needs root, bubblewrap and the fixtures (make deps): without them it
// skips, and fails under CI=true.
func TestScriptPipeline(t *testing.T) {
	sandboxtest.Require(t)
	set, err := fixtures.Load(context.Background())
	if err != nil {
		t.Fatalf("fixtures: %v (make deps builds them)", err)
	}
	helper := t.TempDir()
	if _, err := sandboxtest.BuildHelper(helper); err != nil {
		t.Fatal(err)
	}
	home, err := os.UserHomeDir()
	if err != nil {
		t.Fatal(err)
	}
	testscript.Run(t, scriptParams(t, "testdata/pipeline", func(e *testscript.Env) error {
		e.Setenv("PATH", helper+string(os.PathListSeparator)+e.Getenv("PATH"))
		e.Setenv("FIXTURES_MIMO", set.MiMoDir)
		e.Setenv("FIXTURES_OCI", set.Layout)
		e.Setenv("FIXTURES_REPOSITORY", set.Repository)
		e.Setenv("FIXTURES_GOLD", set.GoldPatches)
		e.Setenv("FIXTURES_SWEBENCH", set.SWEBenchJSONL)
		e.Setenv("FIXTURES_SWEPRO", set.SWEProJSONL)
		e.Setenv("FIXTURES_SWEPRO_SCRIPTS", set.SWEProScripts)
		e.Setenv("FIXTURES_F2P", set.F2PJSONL)
		// Bundles are reused across runs, as in stages/grade's end-to-end
		// test: unpacking the base layer takes a while.
		e.Setenv("BUNDLES", filepath.Join(home, ".cache", "kiln", "grade-test-bundles-"+fixtures.GeneratorVersion))
		return nil
	}))
}

func scriptParams(t *testing.T, dir string, setup func(*testscript.Env) error) testscript.Params {
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return testscript.Params{
		Dir: dir,
		Setup: func(e *testscript.Env) error {
			e.Setenv("REPO", repo)
			vars := e.Vars[:0]
			for _, kv := range e.Vars {
				if !strings.HasPrefix(kv, "KILN_") { // the scripts set what they use
					vars = append(vars, kv)
				}
			}
			e.Vars = vars
			procs := &bgProcs{m: map[string]*bgProc{}}
			e.Values[bgProcsKey{}] = procs
			e.Defer(procs.killAll)
			if setup != nil {
				return setup(e)
			}
			return nil
		},
		Cmds: scriptCmds(),
	}
}

// cmdStatus is "status N COMMAND [ARGS...]": run the command and check
// that it exits with status N (its output is stdout and stderr for the
// next commands, as exec's).
func cmdStatus(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) < 2 {
		ts.Fatalf("usage: status N COMMAND [ARGS...]")
	}
	want, err := strconv.Atoi(args[0])
	if err != nil {
		ts.Fatalf("status: %q is not an exit status", args[0])
	}
	err = ts.Exec(args[1], args[2:]...)
	got := 0
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		got = ee.ExitCode()
	case err != nil:
		ts.Fatalf("status: %v", err)
	}
	if got != want {
		ts.Fatalf("%s exited %d, want %d", args[1], got, want)
	}
}

// scriptCmds are the commands the scripts have beyond testscript's own.
func scriptCmds() map[string]func(ts *testscript.TestScript, neg bool, args []string) {
	return map[string]func(ts *testscript.TestScript, neg bool, args []string){
		"status":       cmdStatus,
		"help-example": cmdHelpExample,
		"envout":       cmdEnvOut,
		"gen":          cmdGen,
		"start":        cmdStart,
		"midrun":       cmdMidrun,
		"signal":       cmdSignal,
		"exited":       cmdExited,
		"read-at-most": cmdReadAtMost,
	}
}

// --- help examples -----------------------------------------------------------

// exampleStandIns replace, in the examples of the --help texts, what a test
// cannot use: a bucket, system paths, the version id of the example's
// grades. A replacement's $VARs are the script's.
var exampleStandIns = []struct{ in, out, why string }{
	{"s3://bucket/kiln", "data", "no network in tests: the local default store stands for the bucket"},
	{"5f2c0e9a1b7d3c4e8f60", "$GRADES_V", "the version the script's grades/step-3 got"},
	{"/var/lib/kiln/images", "$WORK/bundles", "bundles under the script's directory"},
	{"/data/mimo", "$WORK/mimo", "the MiMo files gen mimo wrote"},
	{"/data/layout", "$WORK/layout", "the OCI layout gen layout wrote"},
	{"./terminal-bench-2", "$REPO/fixtures/harbor", "the project's Harbor task directories stand for a Terminal-Bench checkout"},
}

// skippedExamples are the examples of the --help texts that no script
// runs, each with the reason; every other example runs in
// testdata/script/help_examples*.txtar (TestHelpExamplesCovered).
var skippedExamples = []struct{ example, reason string }{
	{"kiln report pipelines/demo.kiln DEMO=/var/tmp/kiln-demo --out demo.html",
		"needs a run's datasets and pipeline record in the store (stages/report's TestBrowser writes one with reporttest and renders FILE.kiln --out in Chromium)"},
	{"kiln report demo/checkpoints/step-1 demo/checkpoints/step-2",
		"needs a run's datasets in the store (stages/report's TestJSONGolden reports checkpoints refs of a run reporttest writes)"},
	{"kiln report pipelines/demo.kiln --tensorboard runs/demo --wandb .",
		"needs a run's datasets and pipeline record, and the trackers' venv (stages/report's TestTrackers writes both and reads them back with TensorBoard's and wandb's own readers)"},
	{"kiln report pipelines/demo.kiln --json | jq '.steps[].figures.pass_rate'",
		"needs a run's datasets and pipeline record, and jq (stages/report's TestFiguresFromTheStore reads FILE.kiln --json)"},
	{"kiln-grade --tasks tasks --images images --bundles /var/lib/kiln/bundles  --rollouts rollouts/step-3 --out grades/step-3",
		"grading runs sandboxes: needs root, bubblewrap and the fixtures' bundles (testdata/pipeline runs kiln-grade on them, TestScriptPipeline)"},
	{"kiln-grade --bundles /var/lib/kiln/bundles --patches preds.jsonl --out grades/preds",
		"grading runs sandboxes (testdata/pipeline runs kiln-grade --patches)"},
	{"kiln-grade --bundles /var/lib/kiln/bundles --baseline --out grades/baseline",
		"grading runs sandboxes (testdata/pipeline runs kiln-grade --baseline)"},
	{"kiln-images build --tasks tasks/harbor --bundles /var/lib/kiln/images  --source kiln.local/fixtures=oci:/data/layout --out images/harbor",
		"needs buildah, root and the fixtures' base layout (stages/images's TestBuildHarborDockerfile builds a fixture Harbor task's Dockerfile)"},
	{"kiln-images verify --tasks tasks/mimo --images images/mimo --bundles /var/lib/kiln/images --gold gold.jsonl --out verify/mimo",
		"grading runs sandboxes: needs root, bubblewrap and the fixtures' bundles (stages/images's TestVerifyGate runs verify and import --verify on them)"},
	{"kiln-rollout adapter --engine http://127.0.0.1:8000 --listen 127.0.0.1:8001  --tokenizer-dir /models/qwen3 --out recordings/claude-1",
		"needs an inference engine and a model's tokenizer"},
	{"kiln-rollout run --tasks tasks@V --images images@V --bundles /var/lib/kiln/bundles  --engine http://gpu1:8000,http://gpu2:8000 --tokenizer-dir /models/qwen3  --samples 8 --weights-version step-3 --out rollout/step-3",
		"needs inference engines, a tokenizer and sandboxes"},
	{"kiln-rollout run --tasks tasks@V --images images@V --bundles /var/lib/kiln/bundles  --engine http://gpu1:8000,http://gpu2:8000 --tokenizer-dir /models/qwen3  --samples 8 --weights weights/policy@W --out rollout/step-4",
		"needs engines serving a kiln-sync weights version, a tokenizer and sandboxes (stages/rollout's TestRunWeights and stages/sync's TestLoopThroughSync run --weights)"},
	{"kiln-rollout run --tasks tasks@V --images images@V --bundles /var/lib/kiln/bundles  --engine replay://rollout/step-3/turns@V --replay-renderer http://gpu1:8000  --tokenizer-dir /models/qwen3 --samples 8 --weights-version step-3 --out replay/step-3",
		"needs a renderer engine, a tokenizer and sandboxes (stages/rollout's TestReplayRun replays a recorded run end to end)"},
	{"kiln-rollout check --tasks tasks@V --images images@V --bundles /var/lib/kiln/bundles  --engine http://gpu1:8000 --tokenizer-dir /models/qwen3 --samples 4 --out check/qwen3",
		"needs an inference engine, a tokenizer and sandboxes"},
	{"kiln-advantages select --grades grades/probe --tasks tasks --min-samples 8 --out tasks/learnable",
		"needs grades kiln-grade wrote against --tasks (select checks that lineage); grading runs sandboxes"},
	{"kiln-train --trajectories trajectories/step-3 --advantages advantages/step-3  --model /models/Qwen3-0.6B --out checkpoints/step-3 --global-batch-size 64",
		"needs a model checkpoint and gpu/'s environment (stages/train's e2e tests train the tiny Qwen3 checkpoint)"},
	{"kiln-train --trajectories trajectories/step-4 --advantages advantages/step-4  --model checkpoints/step-3 --resume-from checkpoints/step-3 --out checkpoints/step-4",
		"needs a committed checkpoint and gpu/'s environment (stages/train's e2e tests resume from one)"},
	{"kiln-train --trajectories trajectories/step-3 --advantages advantages/step-3  --model /models/Qwen3-0.6B --out checkpoints/step-3 --dry-run   # print plan.json and the command",
		"needs a model directory (stages/train/testdata/script runs --dry-run on a fixture model)"},
	{"kiln-sync --checkpoint checkpoints/step-3 --out weights/qwen3 --to /shared/weights  --engine http://node1:8000 --engine http://node2:8000",
		"needs a committed checkpoint and vLLM engines (stages/sync's TestCLICombined runs the combined form against a fake vLLM engine)"},
	{"kiln-sync --checkpoint checkpoints/step-3 --out weights/qwen3 --to /shared/weights  --engine http://node1:30000 --protocol sglang --flush",
		"needs a committed checkpoint and an SGLang engine (internal/enginectl's tests drive the protocol)"},
	{"kiln-sync --checkpoint checkpoints/step-3 --out weights/qwen3 --to /shared/weights  --engine http://node1:8000 --print-version",
		"needs a committed checkpoints version (sync.txtar runs --print-version on a generated model directory)"},
	{"kiln-sync publish --checkpoint checkpoints/step-3 --out weights/qwen3",
		"needs a committed checkpoints version (stages/sync's publish tests publish generated checkpoints)"},
	{"kiln-sync publish --checkpoint /models/Qwen3-0.6B --out weights/qwen3 --full",
		"needs a model directory (sync.txtar publishes a generated one)"},
	{"kiln-sync publish --checkpoint checkpoints/step-4 --out weights/qwen3 --base-dir /local/weights",
		"needs a committed checkpoints version and a pull directory (stages/sync's TestPullReconstructsDeltas publishes xor deltas against one)"},
	{"kiln-sync pull --weights weights/qwen3 --to /local/weights",
		"needs a published weights version (sync.txtar pulls a generated one)"},
	{"kiln-sync pull --weights weights/qwen3@v-3f2a --to /local/weights",
		"names an example version id (sync.txtar pulls a pinned version)"},
	{"kiln-sync reload --engine http://node1:8000 --engine http://node2:8000  --path /local/weights/000007-v-3f2a --version 7",
		"needs vLLM engines (stages/sync's TestCLICombined reloads a fake one)"},
	{"kiln-sync reload --engine http://node1:30000 --protocol sglang  --path /local/weights/000007-v-3f2a --version 7",
		"needs an SGLang engine (internal/enginectl's tests drive the protocol)"},
	{"kiln slurm rl.kiln STEPS=10",
		"needs a Slurm cluster (sbatch); pipelines/slurm's TestKilnSlurmPipeline submits a pipeline to a real one-node cluster with the built kiln"},
	{`duckdb -c "SELECT count(*) FROM read_parquet([$(kiln ls --shards grades/step-3 | sed "s/.*/'&'/" | paste -sd,)])"`,
		"needs the duckdb CLI (datasets.txtar checks kiln ls --shards)"},
}

// helpExamples returns the commands under the "Example:" or "Examples:"
// headings of a help text, continuation lines joined, pipelines included.
func helpExamples(help string) []string {
	var out []string
	in := false
	lines := strings.Split(help, "\n")
	for i := 0; i < len(lines); i++ {
		l := strings.TrimSpace(lines[i])
		switch {
		case l == "Example:" || l == "Examples:":
			in = true
			continue
		case l == "":
			in = false
		}
		if !in {
			continue
		}
		for strings.HasSuffix(l, `\`) && i+1 < len(lines) {
			i++
			l = strings.TrimSuffix(l, `\`) + " " + strings.TrimSpace(lines[i])
		}
		out = append(out, l)
	}
	return out
}

// skipReason is why example is not run, or "".
func skipReason(example string) string {
	for _, s := range skippedExamples {
		if s.example == example {
			return s.reason
		}
	}
	return ""
}

// isPipeline reports whether a command line needs a shell: a pipe or a
// command substitution outside quotes.
func isPipeline(line string) bool {
	return len(pipelineTools(line)) > 1 || strings.Contains(line, "$(")
}

// pipelineTools returns the first word of each command of a pipeline.
func pipelineTools(line string) []string {
	var tools []string
	quote, start := rune(0), true
	for i, r := range line {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			}
		case r == '\'' || r == '"':
			quote = r
		case r == '|':
			start = true
		case start && r != ' ':
			start = false
			tools = append(tools, strings.Fields(line[i:])[0])
		}
	}
	return tools
}

// cmdHelpExample is "help-example BINARY [COMMAND...] N": run the Nth
// example (from 1) of `BINARY COMMAND... --help` as the help prints it,
// with exampleStandIns applied; a pipeline runs in sh, and fails when one
// of its tools is missing (guard the line with [exec:TOOL]). The example's
// output is stdout and stderr for the next commands.
func cmdHelpExample(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) < 2 {
		ts.Fatalf("usage: help-example BINARY [COMMAND...] N")
	}
	n, err := strconv.Atoi(args[len(args)-1])
	if err != nil {
		ts.Fatalf("help-example: %q is not an example number", args[len(args)-1])
	}
	path := args[:len(args)-1]
	help := exec.Command(lookPath(ts, path[0]), append(path[1:], "--help")...)
	help.Args[0], help.Dir, help.Env = path[0], ts.MkAbs("."), scriptEnv(ts)
	out, err := help.Output() // not logged: the example's output is what matters
	if err != nil {
		ts.Fatalf("%s --help: %v", strings.Join(path, " "), err)
	}
	exs := helpExamples(string(out))
	if n < 1 || n > len(exs) {
		ts.Fatalf("`%s --help` has %d example(s), not a number %d", strings.Join(path, " "), len(exs), n)
	}
	ex := exs[n-1]
	if why := skipReason(ex); why != "" {
		ts.Fatalf("%q is in skippedExamples (%s): run it or take it out of the table", ex, why)
	}
	line := ex
	for _, s := range exampleStandIns {
		line = strings.ReplaceAll(line, s.in, os.Expand(s.out, ts.Getenv))
	}
	ts.Logf("example %d of `%s --help`: %s", n, strings.Join(path, " "), ex)
	if isPipeline(line) {
		err = ts.Exec("sh", "-c", line)
	} else {
		words := shellWords(line)
		err = ts.Exec(words[0], words[1:]...)
	}
	if err != nil && !neg {
		ts.Fatalf("%s: %v", line, err)
	}
	if err == nil && neg {
		ts.Fatalf("%s: unexpected success", line)
	}
}

// cmdEnvOut is "envout NAME REGEXP": set $NAME to the first submatch of
// REGEXP (multi-line) in stdout.
func cmdEnvOut(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 2 {
		ts.Fatalf("usage: envout NAME REGEXP")
	}
	re, err := regexp.Compile("(?m)" + args[1])
	ts.Check(err)
	m := re.FindStringSubmatch(ts.ReadFile("stdout"))
	if len(m) < 2 {
		ts.Fatalf("envout: no match of %q (with a group) in stdout", args[1])
	}
	ts.Setenv(args[0], m[1])
}

// --- generated inputs -------------------------------------------------------

// cmdGen writes inputs too big or too binary for a txtar archive:
//
//	gen tasks N FILE          N reference task rows
//	gen turns N FILE          N two-turn agent sessions (rollout i in group i/2); FILE.zst compressed
//	gen mimo N IMAGE DIR      a MiMo code.parquet of N rows and its image-mapping.jsonl, every task on IMAGE
//	gen layout TAG DIR        an OCI layout with one small image, ref.name TAG
//	gen model SEED DIR        a tiny Hugging Face model directory (stages/sync/synctest)
func cmdGen(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) < 3 {
		ts.Fatalf("usage: gen tasks|turns N FILE, gen mimo N IMAGE DIR, gen layout TAG DIR, gen model SEED DIR")
	}
	kind := args[0]
	switch kind {
	case "tasks", "turns":
		n, err := strconv.Atoi(args[1])
		ts.Check(err)
		ts.Check(writeGenerated(ts.MkAbs(args[2]), func(w io.Writer) error {
			if kind == "tasks" {
				return genTasks(w, n)
			}
			return genTurns(w, n)
		}))
	case "mimo":
		if len(args) != 4 {
			ts.Fatalf("usage: gen mimo N IMAGE DIR")
		}
		n, err := strconv.Atoi(args[1])
		ts.Check(err)
		dir := ts.MkAbs(args[3])
		ts.Check(os.MkdirAll(dir, 0o755))
		var pq, mapping bytes.Buffer
		ts.Check(fixtures.WriteMiMoParquet(&pq, &mapping, fixtures.BigOptions{Rows: n, Seed: 1,
			ProblemStatementBytes: 200, TestPatchBytes: 400, IDPrefix: "mimo-task-", Images: []string{args[2]}}))
		ts.Check(os.WriteFile(filepath.Join(dir, "code.parquet"), pq.Bytes(), 0o644))
		ts.Check(os.WriteFile(filepath.Join(dir, "image-mapping.jsonl"), mapping.Bytes(), 0o644))
	case "layout":
		ts.Check(genLayout(ts.MkAbs(args[2]), args[1]))
	case "model":
		// A tiny Hugging Face model directory (kiln-sync's test models).
		seed, err := strconv.ParseUint(args[1], 10, 64)
		ts.Check(err)
		ts.Check(synctest.Tiny(seed, 2, 3, 256).Write(ts.MkAbs(args[2])))
	default:
		ts.Fatalf("gen: unknown kind %q", kind)
	}
}

// writeGenerated writes path from gen, zstd-compressed for a .zst name.
func writeGenerated(path string, gen func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	bw := bufio.NewWriterSize(f, 1<<20)
	var w io.Writer = bw
	var zw *zstd.Encoder
	if strings.HasSuffix(path, ".zst") {
		if zw, err = zstd.NewWriter(bw, zstd.WithEncoderLevel(zstd.SpeedFastest)); err != nil {
			return err
		}
		w = zw
	}
	err = gen(w)
	if zw != nil {
		err = errors.Join(err, zw.Close())
	}
	return errors.Join(err, bw.Flush(), f.Close())
}

// genTasks writes n reference task rows (no image: for kiln import only).
func genTasks(w io.Writer, n int) error {
	for i := range n {
		if _, err := fmt.Fprintf(w, `{"prompt": [{"role": "user", "content": "Fix bug %d in the parser."}], "label": "gen-task-%07d", "metadata": {"instance_id": "gen-task-%07d", "workdir": "/testbed"}}`+"\n", i, i, i); err != nil {
			return err
		}
	}
	return nil
}

// genTurns writes n clean two-turn tool sessions as kiln-rollout assemble
// and kiln import turns read them: the second prompt extends the first
// prompt and output (docs/assembly.md §6's shape). Session i is rollout i,
// index i, group i/2.
func genTurns(w io.Writer, n int) error {
	const (
		sys  = `{"role":"system","content":"S"}`
		call = `{"role":"assistant","content":"call","tool_calls":[{"id":"c1","type":"function","function":{"name":"bash","arguments":"{}"}}]}`
		tool = `{"role":"tool","content":"t"}`
	)
	for i := range n {
		user := fmt.Sprintf(`{"role":"user","content":"task %d"}`, i)
		ids := fmt.Sprintf(`"rollout_id":%d,"index":%d,"group_index":%d,"session":"s%07d","max_context_tokens":1000`, i, i, i/2, i)
		p0 := fmt.Sprintf("100,101,109,200,%d,209,900", 1000+i)
		if _, err := fmt.Fprintf(w, `{%s,"turn":0,"prompt_ids":[%s],"output_ids":[911,909],"output_log_probs":[-0.5,-0.5],"finish_reason":"tool_calls","prompt_messages":[%s,%s],"response_message":%s}`+"\n",
			ids, p0, sys, user, call); err != nil {
			return err
		}
		if _, err := fmt.Fprintf(w, `{%s,"turn":1,"prompt_ids":[%s,911,909,300,311,309,900],"output_ids":[912,909],"output_log_probs":[-0.4,-0.4],"finish_reason":"stop","prompt_messages":[%s,%s,%s,%s],"response_message":{"role":"assistant","content":"done"}}`+"\n",
			ids, p0, sys, user, call, tool); err != nil {
			return err
		}
	}
	return nil
}

// genLayout writes an OCI layout at dir holding one image tagged tag: one
// layer with /testbed/marker, workdir /testbed.
func genLayout(dir, tag string) error {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	mt := time.Unix(1700000000, 0)
	for _, h := range []*tar.Header{
		{Name: "testbed/", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: mt},
		{Name: "testbed/marker", Typeflag: tar.TypeReg, Mode: 0o644, Size: 7, ModTime: mt},
	} {
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
	}
	if _, err := tw.Write([]byte("marker\n")); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	data := b.Bytes()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil },
		tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return err
	}
	img, err := mutate.AppendLayers(mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON), layer)
	if err != nil {
		return err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config.Env, cf.Config.WorkingDir = []string{"PATH=/usr/bin:/bin"}, "/testbed"
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return err
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	return p.AppendImage(img, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": tag}))
}

// --- processes in the background, and signals ---------------------------------

type bgProcsKey struct{}

// bgProcs are the processes a script started with start, by name.
type bgProcs struct {
	mu sync.Mutex
	m  map[string]*bgProc
}

// bgProc is one started process. While it runs, maxRead follows the bytes
// it has read (rchar of /proc/PID/io).
type bgProc struct {
	cmd            *exec.Cmd
	stdout, stderr bytes.Buffer
	done           chan struct{}
	maxRead        atomic.Int64
	exitCode       int
}

func (p *bgProcs) killAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, bp := range p.m {
		select {
		case <-bp.done:
		default:
			_ = bp.cmd.Process.Kill()
			<-bp.done
		}
	}
}

func procOf(ts *testscript.TestScript, name string) *bgProc {
	procs := ts.Value(bgProcsKey{}).(*bgProcs)
	procs.mu.Lock()
	defer procs.mu.Unlock()
	bp := procs.m[name]
	if bp == nil {
		ts.Fatalf("no process %q was started", name)
	}
	return bp
}

// scriptEnv is the environment of a process a script command starts itself:
// the test's, without KILN_ variables, with the script's PATH, HOME, TMPDIR,
// WORK and KILN_ variables the scripts set.
func scriptEnv(ts *testscript.TestScript) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "KILN_") {
			env = append(env, kv)
		}
	}
	for _, k := range []string{"PATH", "HOME", "TMPDIR", "WORK", "KILN_STORE", "KILN_LOG_FORMAT"} {
		if v := ts.Getenv(k); v != "" {
			env = append(env, k+"="+v)
		}
	}
	return env
}

// lookPath finds prog on the script's PATH.
func lookPath(ts *testscript.TestScript, prog string) string {
	for _, dir := range filepath.SplitList(ts.Getenv("PATH")) {
		p := filepath.Join(dir, prog)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p
		}
	}
	ts.Fatalf("%s is not on the script's PATH", prog)
	return ""
}

// cmdStart is "start NAME PROGRAM [ARGS...]": start the program in the
// background, in the script's directory and environment.
func cmdStart(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) < 2 {
		ts.Fatalf("usage: start NAME PROGRAM [ARGS...]")
	}
	procs := ts.Value(bgProcsKey{}).(*bgProcs)
	bp := &bgProc{done: make(chan struct{})}
	bp.cmd = exec.Command(lookPath(ts, args[1]), args[2:]...)
	bp.cmd.Args[0] = args[1]
	bp.cmd.Dir, bp.cmd.Env = ts.MkAbs("."), scriptEnv(ts)
	bp.cmd.Stdout, bp.cmd.Stderr = &bp.stdout, &bp.stderr
	ts.Check(bp.cmd.Start())
	procs.mu.Lock()
	if procs.m[args[0]] != nil {
		procs.mu.Unlock()
		_ = bp.cmd.Process.Kill()
		ts.Fatalf("a process %q was started already", args[0])
	}
	procs.m[args[0]] = bp
	procs.mu.Unlock()
	ioFile := fmt.Sprintf("/proc/%d/io", bp.cmd.Process.Pid)
	go func() {
		for {
			select {
			case <-bp.done:
				return
			case <-time.After(2 * time.Millisecond):
			}
			if n := readChars(ioFile); n > bp.maxRead.Load() {
				bp.maxRead.Store(n)
			}
		}
	}()
	go func() {
		err := bp.cmd.Wait()
		var ee *exec.ExitError
		switch {
		case errors.As(err, &ee):
			bp.exitCode = ee.ExitCode()
		case err != nil:
			bp.exitCode = -1
		}
		close(bp.done)
	}()
}

// readChars is rchar of a /proc/PID/io file (the bytes the process has
// read), or 0 when it cannot be read.
func readChars(ioFile string) int64 {
	b, err := os.ReadFile(ioFile)
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "rchar: "); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}

// processWait bounds every wait on a started process.
const processWait = 2 * time.Minute

// cmdMidrun waits until the process NAME is mid-way through its work, and
// fails if it finishes first (its input is then too small):
//
//	midrun NAME GLOB [COUNT]          at least COUNT (1) paths match GLOB
//	midrun NAME -read FILE FACTOR     it has read FACTOR times FILE's size (rchar)
func cmdMidrun(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) < 2 {
		ts.Fatalf("usage: midrun NAME GLOB [COUNT] | midrun NAME -read FILE FACTOR")
	}
	bp := procOf(ts, args[0])
	var ready func() bool
	var what string
	if args[1] == "-read" {
		if len(args) != 4 {
			ts.Fatalf("usage: midrun NAME -read FILE FACTOR")
		}
		if readChars(fmt.Sprintf("/proc/%d/io", os.Getpid())) == 0 {
			ts.Fatalf("midrun -read: /proc/PID/io is not readable here")
		}
		limit := readLimit(ts, args[2], args[3])
		what = fmt.Sprintf("read %d bytes", limit)
		ready = func() bool { return bp.maxRead.Load() >= limit }
	} else {
		count := 1
		if len(args) > 2 {
			var err error
			count, err = strconv.Atoi(args[2])
			ts.Check(err)
		}
		pattern := ts.MkAbs(args[1])
		what = fmt.Sprintf("made %d path(s) matching %s", count, args[1])
		ready = func() bool {
			m, _ := filepath.Glob(pattern)
			return len(m) >= count
		}
	}
	deadline := time.Now().Add(processWait)
	for !ready() {
		select {
		case <-bp.done:
			ts.Fatalf("%s finished (exit %d) before it %s: make its input bigger\nstderr:\n%s", args[0], bp.exitCode, what, bp.stderr.String())
		case <-time.After(2 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			ts.Fatalf("%s has not %s after %v", args[0], what, processWait)
		}
	}
	ts.Logf("%s has %s", args[0], what)
}

// readLimit is FACTOR times the size of FILE.
func readLimit(ts *testscript.TestScript, file, factor string) int64 {
	f, err := strconv.ParseFloat(factor, 64)
	ts.Check(err)
	fi, err := os.Stat(ts.MkAbs(file))
	ts.Check(err)
	return int64(f * float64(fi.Size()))
}

// cmdSignal is "signal NAME INT|TERM": send the signal to the process.
func cmdSignal(ts *testscript.TestScript, neg bool, args []string) {
	sigs := map[string]syscall.Signal{"INT": syscall.SIGINT, "TERM": syscall.SIGTERM}
	if neg || len(args) != 2 || sigs[args[1]] == 0 {
		ts.Fatalf("usage: signal NAME INT|TERM")
	}
	ts.Check(procOf(ts, args[0]).cmd.Process.Signal(sigs[args[1]]))
}

// cmdExited is "exited NAME CODE": wait for the process to end and check
// its exit status; its output is then in NAME.stdout and NAME.stderr.
func cmdExited(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 2 {
		ts.Fatalf("usage: exited NAME CODE")
	}
	want, err := strconv.Atoi(args[1])
	ts.Check(err)
	bp := procOf(ts, args[0])
	select {
	case <-bp.done:
	case <-time.After(processWait):
		_ = bp.cmd.Process.Kill()
		<-bp.done
		ts.Fatalf("%s still ran after %v: killed", args[0], processWait)
	}
	ts.Check(os.WriteFile(ts.MkAbs(args[0]+".stdout"), bp.stdout.Bytes(), 0o644))
	ts.Check(os.WriteFile(ts.MkAbs(args[0]+".stderr"), bp.stderr.Bytes(), 0o644))
	ts.Logf("%s exited %d\n[stdout]\n%s[stderr]\n%s", args[0], bp.exitCode, bp.stdout.String(), bp.stderr.String())
	if bp.exitCode != want {
		ts.Fatalf("%s exited %d, want %d", args[0], bp.exitCode, want)
	}
}

// cmdReadAtMost is "read-at-most NAME FILE FACTOR": the ended process read
// at most FACTOR times FILE's size: after a signal it stopped reading
// instead of working through the rest of its input.
func cmdReadAtMost(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 3 {
		ts.Fatalf("usage: read-at-most NAME FILE FACTOR")
	}
	bp := procOf(ts, args[0])
	<-bp.done
	limit := readLimit(ts, args[1], args[2])
	if got := bp.maxRead.Load(); got > limit {
		ts.Fatalf("%s read %d bytes, more than %s times the size of %s (%d): it did not stop when signalled", args[0], got, args[2], args[1], limit)
	}
}

// TestHelpExamplesCovered checks that every example of every binary's
// --help (every command's) is run by a help-example line of
// testdata/script/help_examples*.txtar, or is in skippedExamples with the
// reason; that every help-example line names an example that exists; and
// that no skippedExamples entry or exampleStandIns replacement is stale.
func TestHelpExamplesCovered(t *testing.T) {
	type example struct{ at, text string } // at: "BINARY [COMMAND...] N"
	var all []example
	for _, binary := range sortedKeys(binaries) {
		var walk func(path []string, cmds []*cli.Command)
		walk = func(path []string, cmds []*cli.Command) {
			var out, errb bytes.Buffer
			env := &stagecmd.Env{Stdout: &out, Stderr: &errb, Log: stagecmd.NewLogger(&errb, false)}
			code := stagecmd.Main(binaries[binary](env), append(append([]string{binary}, path...), "--help"), &errb)
			require.Equal(t, 0, code, "%s %v --help: %s", binary, path, errb.String())
			for i, ex := range helpExamples(out.String()) {
				all = append(all, example{strings.Join(append(append([]string{binary}, path...), strconv.Itoa(i+1)), " "), ex})
			}
			for _, c := range cmds {
				if c.Name != "help" && !c.SkipFlagParsing {
					walk(append(append([]string{}, path...), c.Name), c.Subcommands)
				}
			}
		}
		var out bytes.Buffer
		app := binaries[binary](&stagecmd.Env{Stdout: &out, Stderr: &out, Log: stagecmd.NewLogger(&out, false)})
		walk(nil, app.Commands)
	}

	run := map[string]string{} // "BINARY [COMMAND...] N" -> where
	scripts, err := filepath.Glob("testdata/script/help_examples*.txtar")
	require.NoError(t, err)
	require.NotEmpty(t, scripts)
	cond := regexp.MustCompile(`^(\[[^]]*\]\s*)*`)
	for _, path := range scripts {
		a, err := txtar.ParseFile(path)
		require.NoError(t, err)
		for i, l := range strings.Split(string(a.Comment), "\n") {
			words := strings.Fields(cond.ReplaceAllString(strings.TrimSpace(l), ""))
			if len(words) > 0 && words[0] == "help-example" {
				run[strings.Join(words[1:], " ")] = fmt.Sprintf("%s:%d", path, i+1)
			}
		}
	}

	exists, skipped := map[string]bool{}, 0
	for _, ex := range all {
		exists[ex.at] = true
		reason := skipReason(ex.text)
		_, ran := run[ex.at]
		switch {
		case ran && reason != "":
			t.Errorf("%s (%s) is run by %s and skipped (%s): take it out of skippedExamples", ex.at, ex.text, run[ex.at], reason)
		case !ran && reason == "":
			t.Errorf("example %s is neither run nor skipped: add `help-example %s` and its checks to testdata/script/help_examples.txtar, or a skippedExamples entry saying why it cannot run there:\n%s", ex.at, ex.at, ex.text)
		case reason != "":
			skipped++
		}
	}
	for at, where := range run {
		assert.True(t, exists[at], "%s: help-example %s: no such example", where, at)
	}
	texts := map[string]bool{}
	joined := ""
	for _, ex := range all {
		texts[ex.text] = true
		joined += ex.text + "\n"
	}
	for _, s := range skippedExamples {
		assert.True(t, texts[s.example], "skippedExamples: no --help has the example %q any more", s.example)
	}
	for _, s := range exampleStandIns {
		assert.Contains(t, joined, s.in, "exampleStandIns: no example has %q any more", s.in)
	}
	assert.Greater(t, len(run), 20, "examples run")
	t.Logf("%d examples: %d run by the scripts, %d skipped (skippedExamples)", len(all), len(run), skipped)
}
