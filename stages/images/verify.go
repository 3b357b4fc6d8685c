package images

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/internal/stagecmd"
	"github.com/kilnrl/kiln/stages/grade"
)

// The verify gate (docs/data-and-grading.md §2.5): every task graded twice
// by kiln-grade's own grading (grade.Run on a patches file), once with the
// empty patch and once with its gold patch, and judged from the grades
// rows. The grades dataset it writes is the record: sample 0 is the empty
// patch, sample 1 the gold patch.
const (
	sampleEmpty = 0
	sampleGold  = 1
	// goldMetadataKey is the tasks metadata key holding a gold patch: the
	// SWE-bench column name, which kiln convert swebench and kiln import
	// tasks keep in metadata.
	goldMetadataKey = "patch"
)

// VerifyHelp is kiln-images verify's manual.
const VerifyHelp = `The gate to run on an image before training on it: for each task of --tasks,
in fresh sandboxes booted from its bundle under --bundles, grade the empty
patch, which must fail (the tests detect the bug), and the task's gold patch,
which must pass (the tests can be passed, and the image has what they need).

The gold patch of a task is its line in --gold (JSON lines {"task_id",
"patch"}, as the fixtures' gold-patches.jsonl), else its metadata "patch"
(SWE-bench rows keep the reference fix there). A task with neither gets the
empty-patch check only, reported as baseline-only.

Grading is kiln-grade's, unchanged (docs/data-and-grading.md §5): the same
sandbox, setup, patch application and grading path per task kind. The result
is a grades dataset (--out) with two rows per task, sample 0 the empty patch
and sample 1 the gold patch, each with its grading log. A task passes the gate
when its sample 0 has reward 0 because its tests ran and failed (failure
tests_failed or timeout) and its sample 1, if any, has reward 1. An image
passes when every task on it does.

Output: one line per image on stdout,
   image   IMAGE  DIGEST  ok|REFUSED  tasks=N gold=G baseline_only=B refused=R
then the grades reference. Each refused task is named on stderr with what
happened and the key of its grading log. Exit status 5 when any image is
refused (the grades dataset is committed either way); a rerun of the same
command reuses the committed grades. Needs what kiln-grade needs: root,
bubblewrap and kiln-sandbox-helper on PATH.

Example:
   kiln-images verify --tasks tasks/mimo --images images/mimo --bundles /var/lib/kiln/images --gold gold.jsonl --out verify/mimo`

// VerifyOptions describe one gate run.
type VerifyOptions struct {
	Tasks, Images string // dataset references
	Bundles       string // the bundle root on this node
	// Gold is a JSON lines file {"task_id", "patch"} ("" = metadata only).
	Gold string
	// Out is the grades dataset to write.
	Out     string
	Jobs    int
	Timeout time.Duration
	// Provider is the sandbox provider ("bwrap" if "").
	Provider string
	// Grader, if set, replaces the grader grade.Run builds (tests).
	Grader *grade.Grader
}

// verifyFlags are verify's flags, bound.
type verifyFlags struct {
	VerifyOptions
}

func verifyCommand(env *stagecmd.Env) *cli.Command {
	f := &verifyFlags{}
	return &cli.Command{
		Name:        "verify",
		Usage:       "check that each task's tests fail without its fix and pass with it, in sandboxes from its bundle",
		Description: VerifyHelp,
		Flags: []cli.Flag{
			stagecmd.StoreFlag(),
			&cli.StringFlag{Name: "tasks", Destination: &f.Tasks, Usage: "tasks dataset to verify (name or name@version)", Required: true},
			&cli.StringFlag{Name: "images", Destination: &f.Images, Usage: "images dataset of the tasks' images (kiln-images import)", Required: true},
			bundlesFlag(&f.Bundles, "bundle root on this node, as kiln-images import made it"),
			&cli.StringFlag{Name: "gold", Destination: &f.Gold, Usage: `gold patches: JSON lines {"task_id", "patch"} (default: each task's metadata "patch")`},
			&cli.StringFlag{Name: "out", Value: "verify", Destination: &f.Out, Usage: "grades dataset name to write"},
			&cli.IntFlag{Name: "jobs", Aliases: []string{"j"}, Value: 2, Destination: &f.Jobs, Usage: "gradings run at once"},
			&cli.DurationFlag{Name: "timeout", Value: grade.DefaultTimeout, Destination: &f.Timeout, Usage: "limit of each grading command (the tests)"},
			&cli.StringFlag{Name: "sandbox", Value: "bwrap", Destination: &f.Provider, Usage: "sandbox provider: bwrap, or local (no isolation; whole-rootfs bundles only)"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() != 0 {
				return stagecmd.Usagef("verify: takes no arguments (got %q); see --help", c.Args().First())
			}
			if err := stagecmd.CheckCount("jobs", f.Jobs, stagecmd.MaxJobs); err != nil {
				return err
			}
			st, err := stagecmd.OpenStore(c)
			if err != nil {
				return err
			}
			_, err = Verify(c.Context, env, st, f.VerifyOptions)
			return err
		},
	}
}

// TaskVerdict is the gate's finding on one task.
type TaskVerdict struct {
	TaskID, Image, Digest string
	HasGold               bool
	// Problem is what failed ("" = the task passes the gate).
	Problem string
	// Log is the store key of the grading log of the failing row.
	Log string
}

// Verify runs the gate per o: grades, writes the grades dataset o.Out,
// prints one line per image and the grades reference on env.Stdout, and
// returns a stagecmd.BadInputError naming every refused task when any is.
func Verify(ctx context.Context, env *stagecmd.Env, st store.Store, o VerifyOptions) ([]TaskVerdict, error) {
	if o.Bundles == "" {
		return nil, stagecmd.Usagef("verify: --bundles DIR is required: the bundle root kiln-images import unpacked the images into")
	}
	inputs, err := stagecmd.ResolveInputs(ctx, st, []string{o.Tasks, o.Images}, dataset.Part{})
	if err != nil {
		return nil, err
	}
	tasks, err := verifyTasks(ctx, st, inputs[0])
	if err != nil {
		return nil, err
	}
	if o.Gold != "" {
		if err := readGold(o.Gold, tasks); err != nil {
			return nil, err
		}
	}
	digests, err := imageDigests(ctx, st, inputs[1])
	if err != nil {
		return nil, err
	}
	patches, err := writeVerifyPatches(tasks)
	if err != nil {
		return nil, err
	}
	defer os.Remove(patches)
	// grade.Run prints its reference on its stdout: hold it back, so that
	// the image lines come first and the reference is the last line.
	var gradeOut bytes.Buffer
	genv := &stagecmd.Env{Stdout: &gradeOut, Stderr: env.Stderr, Log: env.Log, Hook: env.Hook, Quiet: env.Quiet}
	res, err := grade.Run(ctx, genv, st, stagecmd.Output{Name: o.Out, Hook: env.Hook}, grade.Options{
		Tasks: inputs[0].String(), Images: inputs[1].String(), Bundles: o.Bundles, Patches: patches,
		Jobs: o.Jobs, Timeout: o.Timeout, Provider: o.Provider, Grader: o.Grader})
	if err != nil {
		return nil, fmt.Errorf("verify: grading tasks %s on images %s: %w", inputs[0], inputs[1], err)
	}
	rows, err := readGrades(ctx, st, res.Ref)
	if err != nil {
		return nil, err
	}
	verdicts := judge(tasks, digests, rows)
	for _, line := range imageLines(verdicts) {
		fmt.Fprintln(env.Stdout, line)
	}
	var refused []string
	for _, v := range verdicts {
		if v.Problem != "" {
			msg := fmt.Sprintf("task %q (image %s): %s", v.TaskID, v.Image, v.Problem)
			if v.Log != "" {
				msg += " (grading log: " + v.Log + ")"
			}
			fmt.Fprintln(env.Stderr, "verify: REFUSED "+msg)
			refused = append(refused, msg)
		}
	}
	fmt.Fprintln(env.Stdout, res.Ref)
	if len(refused) > 0 {
		return verdicts, stagecmd.BadInputError{Err: fmt.Errorf("verify: %d of %d tasks fail the gate, recorded in %s; fix or drop them before training:\n  %s",
			len(refused), len(verdicts), res.Ref, strings.Join(refused, "\n  "))}
	}
	return verdicts, nil
}

// verifyTask is a task of the gate, in tasks order.
type verifyTask struct {
	id, image string
	gold      string // "" = none
}

type taskList struct {
	ref   dataset.Ref
	order []*verifyTask
	byID  map[string]*verifyTask
}

// verifyTasks reads the tasks and their metadata gold patches.
func verifyTasks(ctx context.Context, st store.Store, ref dataset.Ref) (*taskList, error) {
	v, err := dataset.OpenKind(ctx, st, ref, records.TasksKind(), "verify: --tasks")
	if err != nil {
		return nil, err
	}
	tl := &taskList{ref: v.Ref(), byID: map[string]*verifyTask{}}
	err = v.EachShard(ctx, func(_ int, data []byte) error {
		return records.EachTask(data, func(t records.Task) error {
			vt := &verifyTask{id: t.TaskID}
			if t.Image != nil {
				vt.image = *t.Image
			}
			var md map[string]json.RawMessage
			if err := json.Unmarshal([]byte(t.Metadata), &md); err == nil && md[goldMetadataKey] != nil {
				if err := json.Unmarshal(md[goldMetadataKey], &vt.gold); err != nil {
					return stagecmd.BadInputError{Err: fmt.Errorf("verify: tasks %s: task %q: metadata %q is not a string (%w); it must be the gold patch, a unified diff", ref, t.TaskID, goldMetadataKey, err)}
				}
			}
			tl.byID[t.TaskID] = vt
			tl.order = append(tl.order, vt)
			return nil
		})
	})
	if err != nil {
		return nil, err
	}
	if len(tl.order) == 0 {
		return nil, stagecmd.BadInputError{Err: fmt.Errorf("verify: tasks %s has no task", ref)}
	}
	return tl, nil
}

// readGold sets the gold patches of tasks from a JSON lines file; its
// lines win over the metadata.
func readGold(path string, tasks *taskList) error {
	f, err := os.Open(path)
	if err != nil {
		return stagecmd.UsageError{Err: fmt.Errorf("verify: --gold %q: %w", path, err)}
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 256<<20)
	seen := map[string]int{}
	for n := 1; sc.Scan(); n++ {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		var row struct {
			TaskID *string `json:"task_id"`
			Patch  *string `json:"patch"`
		}
		if err := json.Unmarshal(line, &row); err != nil || row.TaskID == nil || row.Patch == nil {
			if err == nil {
				err = fmt.Errorf("want {\"task_id\": ..., \"patch\": ...}")
			}
			return stagecmd.BadInputError{Err: fmt.Errorf("verify: --gold %q line %d: %w", path, n, err)}
		}
		t := tasks.byID[*row.TaskID]
		if t == nil {
			return stagecmd.BadInputError{Err: fmt.Errorf("verify: --gold %q line %d: task %q is not in tasks %s; drop the line or pass the tasks it belongs to", path, n, *row.TaskID, tasks.ref)}
		}
		if first, dup := seen[*row.TaskID]; dup {
			return stagecmd.BadInputError{Err: fmt.Errorf("verify: --gold %q line %d: task %q has a gold patch on line %d already; keep one", path, n, *row.TaskID, first)}
		}
		seen[*row.TaskID] = n
		t.gold = *row.Patch
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("verify: --gold %q: %w", path, err)
	}
	return nil
}

// imageDigests maps each image of an images version to its digest.
func imageDigests(ctx context.Context, st store.Store, ref dataset.Ref) (map[string]string, error) {
	v, err := dataset.OpenKind(ctx, st, ref, records.ImagesKind(), "verify: --images")
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	err = v.EachShard(ctx, func(_ int, data []byte) error {
		return records.EachImage(data, func(im records.Image) error {
			out[im.Image] = im.Digest
			return nil
		})
	})
	return out, err
}

// writeVerifyPatches writes the gradings of the gate as a kiln-grade
// patches file: per task the empty patch (sample 0), then the gold patch
// (sample 1) if it has one. The file is named by its content, so a rerun
// names the same file and grade.Run's version (which identifies the file by
// path and digest) is the same: the rerun reuses or resumes it.
func writeVerifyPatches(tasks *taskList) (string, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	for _, t := range tasks.order {
		rows := []map[string]any{{"task_id": t.id, "patch": "", "sample": sampleEmpty}}
		if t.gold != "" {
			rows = append(rows, map[string]any{"task_id": t.id, "patch": t.gold, "sample": sampleGold})
		}
		for _, r := range rows {
			if err := enc.Encode(r); err != nil {
				return "", err
			}
		}
	}
	sum := sha256.Sum256(b.Bytes())
	final := filepath.Join(os.TempDir(), "kiln-verify-"+hex.EncodeToString(sum[:12])+".jsonl")
	tmp, err := os.CreateTemp(os.TempDir(), ".kiln-verify-*")
	if err != nil {
		return "", fmt.Errorf("verify: the patches file: %w (set TMPDIR to a writable directory)", err)
	}
	_, err = tmp.Write(b.Bytes())
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), final)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return "", fmt.Errorf("verify: the patches file %q: %w (set TMPDIR to a writable directory)", final, err)
	}
	return final, nil
}

// readGrades reads every row of a grades version.
func readGrades(ctx context.Context, st store.Store, ref dataset.Ref) ([]records.Grade, error) {
	v, err := dataset.Open(ctx, st, ref)
	if err != nil {
		return nil, err
	}
	var rows []records.Grade
	err = v.EachShard(ctx, func(_ int, data []byte) error {
		return records.EachGrade(data, func(g records.Grade) error {
			rows = append(rows, g)
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("verify: reading the grades %s: %w", ref, err)
	}
	return rows, nil
}

// judge applies the gate to the grades rows of the tasks (sample 0 the
// empty patch, sample 1 the gold patch), one verdict per task in tasks
// order:
//   - the empty patch must have reward 0 with failure tests_failed or
//     timeout: the tests ran and did not pass. Reward 1 means the tests do
//     not detect the bug; any other failure (infra_error, no_grading) means
//     the task could not be graded at all on this image.
//   - the gold patch, where the task has one, must have reward 1.
//   - a row missing is a problem too (the grades are not the gate's).
func judge(tasks *taskList, digests map[string]string, rows []records.Grade) []TaskVerdict {
	type key struct {
		task   string
		sample int64
	}
	byKey := map[key]records.Grade{}
	for _, r := range rows {
		byKey[key{r.TaskID, r.Sample}] = r
	}
	logOf := func(r records.Grade) string {
		if r.Log != nil {
			return *r.Log
		}
		return ""
	}
	var out []TaskVerdict
	for _, t := range tasks.order {
		v := TaskVerdict{TaskID: t.id, Image: t.image, Digest: digests[t.image], HasGold: t.gold != ""}
		empty, ok := byKey[key{t.id, sampleEmpty}]
		switch {
		case !ok:
			v.Problem = "no grade of the empty patch"
		case empty.Reward != 0:
			v.Problem, v.Log = "the tests PASS with the empty patch: they do not detect the bug, so rewards on this task mean nothing", logOf(empty)
		case empty.Failure != records.FailureTestsFailed && empty.Failure != records.FailureTimeout:
			v.Problem, v.Log = "the empty patch could not be graded: "+describe(empty), logOf(empty)
		}
		if v.Problem == "" && v.HasGold {
			gold, ok := byKey[key{t.id, sampleGold}]
			switch {
			case !ok:
				v.Problem = "no grade of the gold patch"
			case gold.Reward != 1:
				v.Problem, v.Log = "the gold patch FAILS: "+describe(gold)+"; the tests cannot be passed on this image as it is", logOf(gold)
			}
		}
		out = append(out, v)
	}
	return out
}

// describe is a grades row's failure in a few words.
func describe(r records.Grade) string {
	s := r.Failure
	if r.Failure == records.FailurePatchFailed {
		s += " (the patch does not apply)"
	} else if r.ExitCode >= 0 {
		s += fmt.Sprintf(" (exit %d)", r.ExitCode)
	}
	if r.Error != nil && *r.Error != "" {
		s += ": " + strings.Join(strings.Fields(*r.Error), " ")
	}
	return s
}

// imageLines are verify's stdout lines, one per image in first-seen order.
func imageLines(verdicts []TaskVerdict) []string {
	type tally struct {
		digest                         string
		tasks, gold, baseline, refused int
	}
	var order []string
	by := map[string]*tally{}
	for _, v := range verdicts {
		t := by[v.Image]
		if t == nil {
			t = &tally{digest: v.Digest}
			by[v.Image] = t
			order = append(order, v.Image)
		}
		t.tasks++
		if v.HasGold {
			t.gold++
		} else {
			t.baseline++
		}
		if v.Problem != "" {
			t.refused++
		}
	}
	var lines []string
	for _, im := range order {
		t := by[im]
		state := "ok"
		if t.refused > 0 {
			state = "REFUSED"
		}
		lines = append(lines, fmt.Sprintf("image\t%s\t%s\t%s\ttasks=%d gold=%d baseline_only=%d refused=%d", im, t.digest, state, t.tasks, t.gold, t.baseline, t.refused))
	}
	return lines
}
