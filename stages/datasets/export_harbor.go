package datasets

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/internal/harbor"
	"github.com/kilnrl/kiln/internal/stagecmd"
)

// formatHarbor is kiln export's --format for a tasks dataset: Harbor task
// directories (docs/data-and-grading.md §7.5).
const formatHarbor = "harbor"

// exportHarbor writes every task of v as a Harbor task directory under
// o.out. The directory is built beside it and renamed into place only when
// every task is written, so a failed export leaves nothing at o.out.
func exportHarbor(c *cli.Context, env *Env, v *dataset.Version, o exportFlags) error {
	if v.Kind().Name != records.TasksKind().Name {
		return stagecmd.Usagef("export: --format %s needs a tasks dataset, %s is %s", formatHarbor, v.Ref(), v.Kind().Name)
	}
	if o.out == "" || o.out == "-" {
		return stagecmd.Usagef("export: --format %s writes directories: give --out DIR (a directory that does not exist yet)", formatHarbor)
	}
	out, err := filepath.Abs(o.out)
	if err != nil {
		return stagecmd.UsageError{Err: fmt.Errorf("--out %q: %w", o.out, err)}
	}
	if _, err := os.Lstat(out); err == nil {
		return stagecmd.BadInputf("export: --out %q already exists: name a new directory (kiln export never writes into an existing one)", o.out)
	}
	gold, err := readSolutions(o.solutions)
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(out), "."+filepath.Base(out)+".tmp-")
	if err != nil {
		return fmt.Errorf("export: %w", err)
	}
	defer os.RemoveAll(tmp)
	ctx := c.Context
	attachment := func(rel string) ([]byte, error) {
		rc, _, err := v.OpenAttachment(ctx, rel)
		if err != nil {
			return nil, fmt.Errorf("tasks %s: attachment %q: %w", v.Ref(), rel, err)
		}
		defer rc.Close()
		return io.ReadAll(io.LimitReader(rc, harbor.MaxDirBytes+1<<20))
	}
	dirs := map[string]string{} // directory name -> task id
	n := 0
	for i := range v.Shards {
		data, err := v.ReadShard(ctx, i)
		if err != nil {
			return err
		}
		err = records.EachTask(data, func(t records.Task) error {
			if err := ctx.Err(); err != nil {
				return err
			}
			name := harbor.ExportDirName(t.TaskID)
			if other, dup := dirs[name]; dup {
				return stagecmd.BadInputf("export: tasks %q and %q both become directory %q: Harbor task names allow only letters, digits, '.', '_' and '-'", other, t.TaskID, name)
			}
			dirs[name] = t.TaskID
			notes, err := harbor.WriteTask(filepath.Join(tmp, name), &t, harbor.ExportOptions{Attachment: attachment, GoldPatch: gold[t.TaskID]})
			if err != nil {
				if errors.Is(err, os.ErrNotExist) || errors.Is(err, dataset.ErrCorrupt) {
					return fmt.Errorf("export %s: %w", v.Ref(), err)
				}
				return stagecmd.BadInputError{Err: fmt.Errorf("export %s: %w", v.Ref(), err)}
			}
			for _, note := range notes {
				fmt.Fprintln(env.Stderr, "export: note:", note)
			}
			n++
			return nil
		})
		if err != nil {
			return err
		}
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return err
	}
	if err := os.Rename(tmp, out); err != nil {
		return fmt.Errorf("export: publishing %q: %w", o.out, err)
	}
	var b bytes.Buffer
	writeString(&b, out)
	stagecmd.Fprintln(c, string(asciiJSON([]byte(fmt.Sprintf(`{"output": %s, "tasks": %d}`, b.String(), n)))))
	return nil
}

// readSolutions reads --solutions: gold patches as kiln-grade's --patches
// file has them, {"task_id", "patch"} or SWE-bench predictions
// {"instance_id", "model_patch"}, one JSON object a line. A task named
// twice is bad input.
func readSolutions(path string) (map[string]string, error) {
	out := map[string]string{}
	if path == "" {
		return out, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, stagecmd.BadInputError{Err: fmt.Errorf("--solutions %q: %w", path, err)}
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 256<<20)
	for line := 1; sc.Scan(); line++ {
		text := bytes.TrimSpace(sc.Bytes())
		if len(text) == 0 {
			continue
		}
		var row struct {
			TaskID     string  `json:"task_id"`
			InstanceID string  `json:"instance_id"`
			Patch      *string `json:"patch"`
			ModelPatch *string `json:"model_patch"`
		}
		if err := json.Unmarshal(text, &row); err != nil {
			return nil, stagecmd.BadInputf("--solutions %q line %d: not a JSON object: %v", path, line, err)
		}
		id, patch := row.TaskID, row.Patch
		if id == "" {
			id = row.InstanceID
		}
		if patch == nil {
			patch = row.ModelPatch
		}
		if id == "" || patch == nil {
			return nil, stagecmd.BadInputf("--solutions %q line %d: want {\"task_id\", \"patch\"} or {\"instance_id\", \"model_patch\"}", path, line)
		}
		if _, dup := out[id]; dup {
			return nil, stagecmd.BadInputf("--solutions %q line %d: task %q has a gold patch already", path, line, id)
		}
		out[id] = *patch
	}
	if err := sc.Err(); err != nil {
		return nil, stagecmd.BadInputError{Err: fmt.Errorf("--solutions %q: %w", path, err)}
	}
	return out, nil
}

// harborFormatHelp is export's manual for --format harbor.
var harborFormatHelp = strings.TrimSpace(`
--format harbor (tasks datasets) writes each task as a Harbor task directory
under --out DIR (which must not exist; built beside it, renamed when
complete), named by its task id with characters Harbor's names do not allow
turned into '_'. Harbor's own harness runs them:
  task.toml        schema 1.1: [task].name, [metadata] (workdir, the kiln task
                   id and grading kind, dataset, repo, split, pre_commands),
                   [verifier].timeout_sec 600 (kiln-grade's default),
                   [environment].docker_image (the task's image, prebuilt)
  instruction.md   the problem statement
  tests/test.sh    the verifier: what kiln-grade does for the task's grading
                   kind (eval_cmd: the command, which for MiMo resets the test
                   files, applies the hidden test patch and runs the tests;
                   swebench: reset, test patch, test command, kiln's pytest
                   parser; swepro: the run script and parser; f2p: the
                   script), writing 1 or 0 to /logs/verifier/reward.txt
  solution/solve.sh  applies the gold patch (solution/gold.patch): from
                   --solutions, else the row's metadata.patch (SWE-bench) or
                   grading.other_keys.patch (MiMo); no solution/ without one
A task kiln converted from Harbor is written back as it was read: its
task.toml (every key; [metadata].workdir and reward_metric as kiln used
them), tests/, solution/ and, for a built image, environment/. Harbor's
harness does not run pre_commands (kiln-convert harbor reads them back from
[metadata].pre_commands). A task without a grading payload or image, or two
tasks that get one directory name, is exit 5 and nothing is written. The last
stdout line is {"output": DIR, "tasks": N}.`)
